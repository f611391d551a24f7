"""A fault never becomes a reward (issue 38, item 6): a round with too many failed reader answers
is not trained on (the run stops, or skips and counts), and running out of memory in any phase of
a step stops the run with one line naming the phase and the settings that lower it, the last
checkpoint intact and resumable.

The out-of-memory error is injected into the real fit of a tiny random model at each phase's own
call (the policy's sampler, the reader's generate, the reference log-probs, the update), as
:class:`torch.OutOfMemoryError`, the error a GPU allocation raises.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from pathlib import Path

import pytest
import torch
from test_nonfinite import FaultPlan, fit, grpo
from test_training import write_config

import memalpha.grpo.update as update_
import memalpha.train.step as step_
from memalpha.agent import answer_metrics as scoring
from memalpha.cli import main
from memalpha.lm.core.out_of_memory import is_out_of_memory, memory_held
from memalpha.lm.sampling import generation
from memalpha.reader.base import Reader, ReaderAnswer
from memalpha.reader.local import LocalReader
from memalpha.reader.settings import ReaderSettings
from memalpha.train.step import MAX_SKIPPED_ROUNDS_IN_A_ROW, ReaderGate
from memalpha.train.step_faults import (
    LOWER_MEMORY_SETTINGS,
    ReaderFailureError,
    ReaderFailures,
    StepOutOfMemory,
    out_of_memory_line,
)


def gpu_out_of_memory() -> torch.OutOfMemoryError:
    return torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


# ------------------------------------------------------------------------ the pure rules


def test_the_share_is_failed_questions_over_questions_and_the_first_error_is_kept():
    from memalpha.agent.rollout import RolloutRecord

    def record(errors):
        questions = [{"error": e} for e in errors]
        return RolloutRecord(
            "i", "s", 0, [], {}, 0, 1, questions, reader_failures=sum(e is not None for e in errors)
        )

    failures = ReaderFailures.of([record([None, "HTTP 500"]), record(["timeout", None, None])])
    assert (failures.failed, failures.questions, failures.first_error) == (2, 5, "HTTP 500")
    assert failures.share == pytest.approx(0.4)
    assert ReaderFailures.of([]).share == 0.0


def gate(max_failed_share: float, on_failed_round: str) -> ReaderGate:
    return ReaderGate(ReaderSettings(max_failed_share=max_failed_share, on_failed_round=on_failed_round))


def test_a_round_at_the_limit_trains_and_one_over_it_stops_or_is_skipped():
    at_limit = ReaderFailures(failed=1, questions=10, first_error="HTTP 500")
    assert gate(0.1, "stop").answered(at_limit, "rollout round 0")
    over = ReaderFailures(failed=2, questions=10, first_error="HTTP 500: boom")
    with pytest.raises(ReaderFailureError) as stopped:
        gate(0.1, "stop").answered(over, "rollout round 4")
    message = str(stopped.value)
    assert message.startswith(
        "rollout round 4: 2 of 10 reader answers failed (20%, over reader.max_failed_share=0.1)"
    )
    assert "first error: HTTP 500: boom" in message and "\n" not in message
    with pytest.warns(UserWarning, match="round 4: 2 of 10 reader answers failed; the round is skipped"):
        assert gate(0.1, "skip").answered(over, "rollout round 4") is False
    assert gate(1.0, "stop").answered(ReaderFailures(10, 10, "x"), "r")  # 1 trains on anything
    with pytest.raises(ReaderFailureError):
        gate(0.0, "stop").answered(ReaderFailures(1, 100, "x"), "r")  # 0 refuses any failure


@pytest.mark.filterwarnings("ignore:memalpha. r. 1 of 1 reader answers failed")
def test_skipped_rounds_stop_the_run_only_in_a_row():
    streak, failed, fine = gate(0.1, "skip"), ReaderFailures(1, 1, "e"), ReaderFailures(0, 1, None)
    for _ in range(MAX_SKIPPED_ROUNDS_IN_A_ROW - 1):
        assert not streak.answered(failed, "r")
    assert streak.answered(fine, "r")  # a trained round ends the streak
    assert streak.skipped_in_a_row == 0
    for _ in range(MAX_SKIPPED_ROUNDS_IN_A_ROW - 1):
        streak.answered(failed, "r")
    with pytest.raises(ReaderFailureError, match=f"{MAX_SKIPPED_ROUNDS_IN_A_ROW} rounds in a row skipped"):
        streak.answered(ReaderFailures(1, 1, "connection refused"), "rollout round 9")


@pytest.mark.parametrize(
    "bad", [{"max_failed_share": -0.1}, {"max_failed_share": 1.5}, {"on_failed_round": "ignore"}]
)
def test_the_settings_are_checked(bad):
    with pytest.raises(ValueError, match=f"reader.{next(iter(bad))}"):
        ReaderSettings(**bad)


def test_out_of_memory_is_told_from_other_failures():
    assert is_out_of_memory(gpu_out_of_memory())
    assert is_out_of_memory(
        RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 GB")
    )
    assert not is_out_of_memory(RuntimeError("shape mismatch"))
    assert not is_out_of_memory(ValueError("out of memory"))  # only the allocator's own errors
    assert "GiB" in memory_held("cpu")


@pytest.mark.parametrize("phase", sorted(LOWER_MEMORY_SETTINGS))
def test_the_line_names_the_phase_the_memory_and_what_lowers_it(phase):
    line = out_of_memory_line(phase, "global step 3", "1.0 GiB peak resident memory")
    assert line.startswith(
        f"out of memory in the {phase} phase of global step 3 (1.0 GiB peak resident memory)"
    )
    assert all(setting in line for setting in LOWER_MEMORY_SETTINGS[phase]) and "\n" not in line


# ------------------------------------------------------------------- the readers let it through


def test_the_local_reader_raises_out_of_memory_instead_of_failing_its_items(
    tiny_model_dir, tokenizer, monkeypatch
):
    from transformers import AutoModelForCausalLM

    def out_of_memory(*args, **kwargs):
        raise gpu_out_of_memory()

    monkeypatch.setattr(generation, "generate", out_of_memory)
    reader = LocalReader(AutoModelForCausalLM.from_pretrained(tiny_model_dir), tokenizer, max_new_tokens=4)
    with pytest.raises(torch.OutOfMemoryError):
        reader.complete(["What is the capital of Norway?"])
    assert reader.failures == 0


def test_whatever_a_reader_backend_raises_propagates_and_is_never_a_failed_answer():
    class Backend(Reader):
        error: Exception

        def chat(self, conversations):
            raise self.error

        def count_tokens(self, text):
            return len(text.split())

    reader = Backend()
    for error in (TypeError("a bug of our own"), RuntimeError("socket closed"), gpu_out_of_memory()):
        reader.error = error
        with pytest.raises(type(error)):
            reader.complete(["q"])
    assert reader.failures == 0


def test_a_bug_in_the_local_readers_decoding_stops_instead_of_scoring_zero(
    tiny_model_dir, tokenizer, monkeypatch
):
    from transformers import AutoModelForCausalLM

    def broken(*args, **kwargs):
        raise TypeError("generate() got an unexpected keyword argument 'x'")

    monkeypatch.setattr(generation, "generate", broken)
    reader = LocalReader(AutoModelForCausalLM.from_pretrained(tiny_model_dir), tokenizer, max_new_tokens=4)
    with pytest.raises(TypeError, match="unexpected keyword"):
        reader.complete(["What is the capital of Norway?"])
    assert reader.failures == 0


# ------------------------------------------------------------ a real fit, a fault in each phase


def inject_out_of_memory(phase: str, monkeypatch) -> None:
    """Make ``phase``'s own call raise a GPU out-of-memory error."""

    def raising(*args, **kwargs):
        raise gpu_out_of_memory()

    if phase in ("sampling", "reader"):  # every local sampler's generate: the policy's calls come first,
        # and with the policy's (announced as sampling) let through, the reader's are next
        real = generation.generate

        def raising_for(*args, **kwargs):
            if phase == "reader" and kwargs.get("announce_as") == "sampling":
                return real(*args, **kwargs)
            raise gpu_out_of_memory()

        monkeypatch.setattr(generation, "generate", raising_for)
    elif phase == "logprobs":
        monkeypatch.setattr(step_, "response_logprobs", raising)
    elif phase == "update":
        monkeypatch.setattr(update_, "accumulate_grpo_gradients", raising)


@pytest.mark.parametrize("phase", ["sampling", "reader", "logprobs", "update"])
def test_out_of_memory_in_each_phase_stops_the_fit_naming_that_phase(
    phase, tmp_path, tiny_model_dir, monkeypatch
):
    module, data = grpo(tiny_model_dir, tmp_path)
    inject_out_of_memory(phase, monkeypatch)
    with pytest.raises(StepOutOfMemory) as stopped:
        fit(module, data, FaultPlan({}), monkeypatch, tmp_path, max_steps=1)
    message = str(stopped.value)
    assert message.startswith(f"out of memory in the {phase} phase of global step 1 ("), message
    assert LOWER_MEMORY_SETTINGS[phase][0] in message and "\n" not in message


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_cli_stops_with_one_line_and_the_checkpoint_resumes(tmp_path, tiny_model_dir, monkeypatch):
    """Step 1 trains and is checkpointed; step 2 runs out of memory in its update: one line, the
    checkpoint of step 1 untouched, and a resumed run trains step 2 from it."""
    config = write_config(tmp_path, tiny_model_dir, max_steps=2, instances_per_step=1)
    main(["fit", "--config", str(config), "--trainer.max_steps", "1"])
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    before = digest(last)

    real = update_.accumulate_grpo_gradients
    def out_of_memory(*args, **kwargs):
        raise gpu_out_of_memory()

    monkeypatch.setattr(update_, "accumulate_grpo_gradients", out_of_memory)
    with pytest.raises(SystemExit) as stopped:
        main(["fit", "--config", str(config), "--ckpt_path", str(last)])
    message = str(stopped.value.code)
    assert message.startswith("memalpha fit: error: out of memory in the update phase of global step 2 ("), (
        message
    )
    assert "model.update.micro_batch_size" in message and "\n" not in message
    assert digest(last) == before

    monkeypatch.setattr(update_, "accumulate_grpo_gradients", real)
    main(["fit", "--config", str(config), "--ckpt_path", str(last)])
    assert torch.load(last, weights_only=False)["global_step"] == 2


# ------------------------------------------------------------- a real fit with a failing reader


def failing_chat(fail_calls: set[int] | None):
    """A LocalReader.chat whose answers all fail on the calls numbered in ``fail_calls`` (all: None)."""
    calls = []

    def chat(self, conversations, sampling=None):
        calls.append(len(conversations))
        if fail_calls is None or len(calls) - 1 in fail_calls:
            return [ReaderAnswer("", False, "RuntimeError: reader down") for _ in conversations]
        return [ReaderAnswer("Oslo", True) for _ in conversations]

    return chat, calls


def test_a_round_whose_reader_failed_stops_the_cli_with_one_line(tmp_path, tiny_model_dir, monkeypatch):
    chat, _ = failing_chat(None)
    monkeypatch.setattr(LocalReader, "chat", chat)
    config = write_config(tmp_path, tiny_model_dir, max_steps=2, instances_per_step=1)
    with pytest.raises(SystemExit) as stopped:
        main(["fit", "--config", str(config)])
    message = str(stopped.value.code)
    assert message.startswith(
        "memalpha fit: error: rollout round 0 (global step 0): 4 of 4 reader answers failed (100%, over"
        " model.reader.max_failed_share=0.1); first error: RuntimeError: reader down"
    ), message
    assert "\n" not in message
    assert not (tmp_path / "run" / "checkpoints" / "last.ckpt").exists()  # nothing was trained


def test_skipped_rounds_are_counted_and_the_run_trains_on_once_the_reader_answers(
    tmp_path, tiny_model_dir, monkeypatch
):
    chat, calls = failing_chat({0})  # the first round's answers fail, later ones come back
    monkeypatch.setattr(LocalReader, "chat", chat)
    rng = random.Random(0)  # seeded random scores: the groups' advantages are not 0, so a step moves
    monkeypatch.setitem(scoring.METRICS, "substring", lambda prediction, gold: rng.random())
    module, data = grpo(tiny_model_dir, tmp_path)
    module.reader_settings.on_failed_round = "skip"
    plan = FaultPlan({})
    trainer = fit(module, data, plan, monkeypatch, tmp_path, max_steps=1)
    assert trainer.global_step == 1 and len(calls) == 2  # round 0 skipped, round 1 trained
    assert module.grpo_step.reader_gate.skipped_in_a_row == 0
    assert plan.calls[0]["unchanged"] and not plan.calls[1]["unchanged"]
    assert all(math.isfinite(call["grad_norm"]) for call in plan.calls[1:])


def test_a_reader_that_stays_down_stops_a_skipping_run(tmp_path, tiny_model_dir, monkeypatch):
    chat, calls = failing_chat(None)
    monkeypatch.setattr(LocalReader, "chat", chat)
    module, data = grpo(tiny_model_dir, tmp_path)
    module.reader_settings.on_failed_round = "skip"
    with pytest.raises(ReaderFailureError, match=f"{MAX_SKIPPED_ROUNDS_IN_A_ROW} rounds in a row skipped"):
        fit(module, data, FaultPlan({}), monkeypatch, tmp_path, max_steps=5)
    assert len(calls) == MAX_SKIPPED_ROUNDS_IN_A_ROW


def dead_reader_options() -> list[str]:
    """The openai reader pointed at a port nobody listens on, without retries: every answer fails."""
    from test_reader_faults import free_port

    return [
        "--model.reader.kind", "openai",
        "--model.reader.openai.base_url", f"http://127.0.0.1:{free_port()}/v1",
        "--model.reader.openai.max_retries", "0",
    ]


def test_validate_against_a_dead_reader_exits_nonzero_and_its_report_says_invalid(tmp_path, tiny_model_dir):
    config = write_config(tmp_path, tiny_model_dir)
    with pytest.raises(SystemExit) as stopped:
        main(["validate", "--config", str(config), *dead_reader_options()])
    message = str(stopped.value.code)
    assert message.startswith("memalpha validate: error: validation at global step 0: 4 of 4 reader answers"
                              " failed (100%, over model.reader.max_failed_share=0.1)"), message
    assert "\n" not in message and "not valid" in message
    [report] = (tmp_path / "run").rglob("validation.json")
    summary = json.loads(report.read_text())["summary"]
    assert summary["invalid"].startswith("validation at global step 0: 4 of 4")


class _TwoRanks:
    """The other rank holds ``other``: each mean is over this rank's value and that one."""

    world_size = 2

    def __init__(self, other: float) -> None:
        self.other = other

    def mean_over_ranks(self, value: float) -> float:
        return (value + self.other) / 2


def test_counts_are_summed_over_the_ranks_exactly():
    from memalpha.grpo.update import ONE_PROCESS, sum_over_ranks

    assert sum_over_ranks(ONE_PROCESS, 7) == 7
    assert sum_over_ranks(_TwoRanks(other=5.0), 8) == 13  # (8 + 5) / 2 * 2
    assert sum_over_ranks(_TwoRanks(other=0.0), 1) == 1  # 0.5 * 2, not rounded away
