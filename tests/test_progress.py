"""What a person watching a run sees: the step-counting progress bar and its phases, one-line
errors raised mid-run, and chunks over the prompt budget refused when the data loads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import lightning.pytorch  # noqa: F401 - its log handler must bind the session's stderr, not one test's capsys
import pytest
from test_training import scalars, version_dirs, write_config

from memalpha.agent.progress import Phase
from memalpha.agent.prompt_budget import check_prompt_budget
from memalpha.agent.reward_settings import RewardSettings
from memalpha.agent.rollout import Agent, RolloutError, turn_prompt
from memalpha.agent.rollout_settings import RolloutSettings
from memalpha.cli import main
from memalpha.data.schema import QA, Instance
from memalpha.memory.store import Memory
from memalpha.tools.formats import get_call_format
from memalpha.train.lightning_cli import qualify_options
from memalpha.train.progress_bar import StepProgressBar, run_steps

REPO = Path(__file__).resolve().parents[1]
LONG_CHUNK = " ".join(f"word{i} alpha beta" for i in range(900))  # ~5k tokens


def long_instance_file(folder: Path) -> Path:
    """A JSONL file of one instance whose second chunk cannot fit a 2048-token prompt."""
    record = {
        "instance_id": "long-1",
        "data_source": "synth_personal",
        "chunks": ["Alice lives in Paris.", LONG_CHUNK],
        "questions": [{"question": "Where does Alice live?", "answer": "Paris"}],
    }
    path = folder / "long.jsonl"
    path.write_text(json.dumps(record) + "\n")
    return path


# ------------------------------------------------------------------ phases
def test_rollouts_report_their_phases_in_order(tiny_model_dir, tokenizer):
    from transformers import AutoModelForCausalLM

    from memalpha.lm.core.policy import LoraSettings, load_policy
    from memalpha.reader.local import LocalReader

    policy, _ = load_policy(tiny_model_dir, lora=LoraSettings(r=4, alpha=8))
    reader = LocalReader(AutoModelForCausalLM.from_pretrained(tiny_model_dir), tokenizer, max_new_tokens=2)
    qa = [QA("Where does Anna live?", "Oslo")]
    instances = [
        Instance("a", "synth_personal", ["Anna lives in Oslo.", "Bo is 31."], qa),
        Instance("b", "synth_personal", ["Anna lives in Oslo.", "Bo is 31.", "Cy likes tea."], qa * 2),
    ]
    settings = RolloutSettings(
        group_size=2, max_new_tokens=4, max_prompt_tokens=4096, prompt_profile="compact"
    )
    heard: list[Phase] = []

    out = Agent(policy, tokenizer, reader, settings, RewardSettings()).rollouts(
        instances, seed=0, on_phase=heard.append
    )

    assert [(p.name, p.index, p.total) for p in heard] == [
        ("sampling", 1, 3),
        ("sampling", 2, 3),
        ("sampling", 3, 3),
        ("reader", None, 6),
        ("rewards", None, None),
    ]
    assert heard[0].tokens_per_s is None and heard[1].tokens_per_s > 0  # the rate of the chunks done so far
    assert heard[1].describe().startswith("sampling chunk 2/3, ") and heard[1].describe().endswith(" tok/s")
    assert out.rewards_s > 0


def test_a_phase_must_be_known():
    with pytest.raises(ValueError, match="phase must be one of"):
        Phase("thinking")


# -------------------------------------------------------------- the bar
def test_run_steps_is_max_steps_or_the_epochs_rounds():
    def module(rounds, per_round):
        return SimpleNamespace(schedule_rounds=lambda: (rounds, per_round))

    assert run_steps(SimpleNamespace(max_steps=10), module(None, None)) == 10
    assert run_steps(SimpleNamespace(max_steps=-1), module(4, 3)) == 12
    assert run_steps(SimpleNamespace(max_steps=5), module(4, 3)) == 5
    assert run_steps(SimpleNamespace(max_steps=-1), module(4, None)) is None  # steps per round vary
    assert run_steps(SimpleNamespace(max_steps=-1), SimpleNamespace()) is None


def test_a_two_step_fit_counts_steps_and_shows_each_phase(tmp_path, tiny_model_dir, monkeypatch, capsys):
    seen: list[tuple] = []
    show_phase, batch_end = StepProgressBar.show_phase, StepProgressBar.on_train_batch_end

    def record_phase(self, phase):
        seen.append(("phase", self.trainer.global_step, self.trainer.validating, phase.name))
        show_phase(self, phase)

    def record_step(self, trainer, *args):
        batch_end(self, trainer, *args)
        seen.append(("step", self.train_progress_bar.n, self.train_progress_bar.total))

    monkeypatch.setattr(StepProgressBar, "show_phase", record_phase)
    monkeypatch.setattr(StepProgressBar, "on_train_batch_end", record_step)
    main(["fit", "--config", str(write_config(tmp_path, tiny_model_dir, max_steps=2))])

    one_step = ["sampling", "sampling", "reader", "rewards", "logprobs", "update"]
    training = [(e[1], e[3]) for e in seen if e[0] == "phase" and not e[2]]
    assert training == [(0, name) for name in one_step] + [(1, name) for name in one_step]
    assert [e for e in seen if e[0] == "step"] == [("step", 1, 2), ("step", 2, 2)]
    assert [e[3] for e in seen if e[0] == "phase" and e[2]] == ["sampling", "sampling", "reader", "rewards"]
    screen = capsys.readouterr().out.replace("\r", "\n")
    last = [line for line in screen.splitlines() if "steps [" in line][-1]
    assert last.startswith("step 2 done") and "2/2 steps" in last, last
    assert "reward=" in last and "tool_success=" in last and "step_s=" in last
    assert "step 1: sampling chunk 2/2, " in screen and "Epoch" not in screen
    values = scalars(version_dirs(tmp_path)[0])
    for tag in (
        "perf/rollout_s",
        "perf/reader_s",
        "perf/rewards_s",
        "perf/ref_old_logprob_s",
        "perf/train_s",
    ):
        assert set(values[tag]) == {0, 1}, tag


def test_on_a_terminal_the_running_bar_is_redrawn_until_teardown(monkeypatch):
    import time

    from memalpha.train import progress_bar

    class Bar:
        disable, redraws = False, 0

        def refresh(self):
            self.redraws += 1

    monkeypatch.setattr(progress_bar, "_on_terminal", lambda: True)
    monkeypatch.setattr(progress_bar, "TICK_S", 0.02)
    trainer = SimpleNamespace(is_global_zero=True, validating=False, sanity_checking=False, predicting=False)
    bar, callback = Bar(), StepProgressBar()
    callback._train_progress_bar = bar
    callback.setup(trainer, None, "fit")
    time.sleep(0.3)
    callback.teardown(trainer, None, "fit")
    time.sleep(0.1)
    redraws = bar.redraws
    time.sleep(0.2)
    assert redraws >= 3 and bar.redraws == redraws


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ([], "StepProgressBar"),
        (["--trainer.callbacks+=lightning.pytorch.callbacks.RichProgressBar"], "RichProgressBar"),
        (["--trainer.enable_progress_bar=false"], None),
    ],
    ids=["default", "the config's own bar", "no bar"],
)
def test_the_step_bar_is_the_default_and_a_configured_bar_wins(
    tmp_path, tiny_model_dir, monkeypatch, extra, expected
):
    from lightning.pytorch import Trainer

    bars = []
    monkeypatch.setattr(Trainer, "fit", lambda self, *args, **kwargs: bars.append(self.progress_bar_callback))
    main(["fit", "--config", str(write_config(tmp_path, tiny_model_dir)), *extra])
    assert [type(bar).__name__ if bar else None for bar in bars] == [expected]


# ---------------------------------------------------------- the budget
def test_the_budget_check_agrees_with_the_rollout_to_the_token(tokenizer):
    settings = RolloutSettings(prompt_profile="compact", call_format="hermes")
    chunk = "Anna lives in Oslo. " * 40
    needed = len(turn_prompt(tokenizer, Memory(), chunk, get_call_format("hermes"), settings, "x")[1])
    instance = Instance("anna", "synth_personal", ["short", chunk], [QA("Where?", "Oslo")])

    check_prompt_budget([instance], tokenizer, replace(settings, max_prompt_tokens=needed), "f")
    with pytest.raises(RolloutError) as info:
        check_prompt_budget(
            [instance], tokenizer, replace(settings, max_prompt_tokens=needed - 1), "data.x=f.jsonl"
        )
    assert str(info.value).startswith("data.x=f.jsonl: instance 'anna', chunk 1 (")
    assert f"the prompt needs {needed} tokens" in str(info.value)
    assert f"rollout.max_prompt_tokens={needed - 1}" in str(info.value)


def test_a_token_chunked_instance_names_data_chunk_tokens(tokenizer):
    instance = Instance("ctx-0", "icl", [LONG_CHUNK], [QA("q", "a")], {"chunk_tokens": 8192})
    with pytest.raises(
        RolloutError, match=r"cut at data.load.chunk_tokens=8192: the prompt needs \d+ tokens"
    ):
        check_prompt_budget(
            [instance], tokenizer, RolloutSettings(max_prompt_tokens=2048), "data.train_path=b.json"
        )


def test_a_chunk_over_the_budget_stops_validate_in_one_line_before_the_model_loads(tmp_path, tiny_model_dir):
    config = write_config(tmp_path, tiny_model_dir)  # model.rollout.max_prompt_tokens: 2048
    data = long_instance_file(tmp_path)
    command = [str(Path(sys.executable).with_name("memalpha")), "validate", "--config", str(config),
               "--data.val_path", str(data)]
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO))
    env.pop("MEMALPHA_DEBUG", None)
    proc = subprocess.run(
        command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False
    )

    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert errors == [proc.stderr.strip().splitlines()[-1]], errors
    assert errors[0].startswith(
        f"memalpha validate: error: data.val_path={data}: instance 'long-1', chunk 1 ("
    )
    assert "over model.rollout.max_prompt_tokens=2048" in errors[0]
    assert not list(tmp_path.rglob("validation.json"))

    debug = subprocess.run(
        command,
        env={**env, "MEMALPHA_DEBUG": "1"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert debug.returncode == 1 and "Traceback" in debug.stderr and "RolloutError" in debug.stderr


def test_a_rollout_error_mid_run_is_one_line_naming_instance_and_setting(
    tmp_path, tiny_model_dir, monkeypatch
):
    import memalpha.train.module

    monkeypatch.delenv("MEMALPHA_DEBUG", raising=False)
    # let it reach the rollout
    monkeypatch.setattr(memalpha.train.module, "check_prompt_budget", lambda *args, **kwargs: None)
    config = write_config(
        tmp_path, tiny_model_dir, train_path=str(long_instance_file(tmp_path)), instances_per_step=1
    )
    with pytest.raises(SystemExit) as info:
        main(["fit", "--config", str(config)])
    message = str(info.value.code)
    assert message.startswith("memalpha fit: error: instance 'long-1', chunk 1: the prompt needs "), message
    assert "over model.rollout.max_prompt_tokens=2048" in message and "\n" not in message
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_qualify_options_writes_setting_names_as_options():
    keys = ["model.rollout.max_prompt_tokens", "model.rollout.vllm.max_logprob_gap", "data.load.chunk_tokens",
            "data.val_path"]
    assert qualify_options(
        "data.val_path=/x/a.jsonl: over rollout.max_prompt_tokens=5; data.load.chunk_tokens=2, "
        "rollout.vllm.max_logprob_gap 1",
        keys,
    ) == (
        "data.val_path=/x/a.jsonl: over model.rollout.max_prompt_tokens=5; data.load.chunk_tokens=2, "
        "model.rollout.vllm.max_logprob_gap 1"
    )
    assert qualify_options("e.g. a.jsonl or max_prompt_tokens", keys) == "e.g. a.jsonl or max_prompt_tokens"
