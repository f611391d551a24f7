"""Supervised fine-tuning on demonstrations: the loss, the demonstration files, the oracle, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from conftest import randomise_lora_b
from numerics import GRADIENT_REL, assert_close, assert_same_gradients

from memalpha.agent.oracle_demos import oracle_demonstrations
from memalpha.agent.rollout_settings import RolloutSettings
from memalpha.data.demo_files import Demonstration, load_demonstrations, save_demonstrations
from memalpha.data.schema import DataValidationError
from memalpha.data.synthetic import generate_synthetic
from memalpha.grpo.optimizer import build_optimizer
from memalpha.grpo.settings import OptimizerSettings
from memalpha.grpo.update import optimizer_step
from memalpha.lm.core.policy import LoraSettings, load_policy
from memalpha.lm.core.prompt_sharing import pad_prompt_response
from memalpha.lm.logprobs.spec import LogprobSpec
from memalpha.memory.store import Memory
from memalpha.tools.executor import execute_call
from memalpha.tools.formats import get_call_format
from memalpha.train.sft_loss import accumulate_sft_gradients, masked_nll

REPO = Path(__file__).resolve().parents[1]


def test_masked_nll_counts_response_tokens_only():
    logps = torch.tensor([[-0.5, -1.0, -7.0], [-2.0, -9.0, -9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    # (0.5 + 1.0 + 2.0) / 3 response tokens; the -7 and -9 entries are padding
    assert masked_nll(logps, mask, normaliser=3.0).item() == pytest.approx(3.5 / 3)
    assert masked_nll(logps, mask, normaliser=6.0).item() == pytest.approx(3.5 / 6)  # a larger step's share
    with pytest.raises(ValueError, match="normaliser"):
        masked_nll(logps, mask, normaliser=0.0)


PROMPTS = [[11, 12, 13, 14, 20, 21], [11, 12, 13, 14, 30], [11, 12, 13, 14, 40, 41, 42]]
RESPONSES = [[100, 200, 2], [300], [400, 401]]


def _naive_nll(model, prompts, responses):
    """Full logits, log_softmax, gather at response positions only: the reference SFT loss."""
    batch = pad_prompt_response(prompts, responses, pad_id=0)
    logits = model(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids
    ).logits
    start = batch.prompt_width - 1
    logp = torch.log_softmax(logits[:, start : start + batch.response_mask.shape[1]], dim=-1)
    picked = logp.gather(-1, batch.input_ids[:, batch.prompt_width :, None]).squeeze(-1)
    mask = batch.response_mask.bool()
    return -(picked * mask).sum() / mask.sum(), (logp.argmax(-1) == batch.input_ids[:, batch.prompt_width :])[
        mask
    ]


def test_sft_loss_and_gradients_equal_the_naive_masked_cross_entropy(tiny_model_dir):
    torch.manual_seed(0)
    model, _ = load_policy(tiny_model_dir, lora=LoraSettings(r=4, alpha=8))
    model.to(torch.float64)
    randomise_lora_b(model, 0.2)

    def grads(fn):
        model.zero_grad(set_to_none=True)
        value = fn()
        return value, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    tokens = float(sum(map(len, RESPONSES)))
    losses: list[torch.Tensor] = []
    metrics, ours = grads(
        lambda: accumulate_sft_gradients(
            model, PROMPTS, RESPONSES, LogprobSpec(micro_batch_size=2, pad_id=0), token_normaliser=tokens,
            backward=lambda loss: (losses.append(loss.detach()), loss.backward()),
        )[0]
    )
    (naive_loss, naive_hits), naive = grads(lambda: _naive_nll(model, PROMPTS, RESPONSES))
    naive_loss.backward()
    naive = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    assert len(losses) == 2  # one backward per micro-batch
    # two different paths through the model (a cached prefix vs one full forward): float32 inside
    # HF's attention and norms bounds their agreement at ~1e-7 (tests/numerics.py)
    assert_close(
        torch.tensor(metrics["loss"], dtype=torch.float64), naive_loss.detach(), GRADIENT_REL, "loss"
    )
    assert metrics["tokens"] == tokens
    assert metrics["token_accuracy"] == pytest.approx(float(naive_hits.double().mean()))
    assert_same_gradients(ours, naive, GRADIENT_REL)


def test_sft_memorises_four_demonstrations(small_vocab_model_dir):
    torch.manual_seed(0)
    model, _ = load_policy(small_vocab_model_dir, lora=LoraSettings(r=16, alpha=32))
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer, _ = build_optimizer(
        params, OptimizerSettings(learning_rate=1e-2, weight_decay=0.0, warmup_ratio=0.0)
    )
    prompts = [[1, 3, 4], [6, 7], [4, 4, 1], [5]]
    responses = [[5, 6, 2], [3, 1], [7, 7, 3], [4, 2]]
    tokens = float(sum(map(len, responses)))
    history = []
    for _ in range(100):
        optimizer.zero_grad(set_to_none=True)
        metrics, finite = accumulate_sft_gradients(
            model, prompts, responses, LogprobSpec(micro_batch_size=4, pad_id=0), token_normaliser=tokens,
            backward=lambda loss: loss.backward(),
        )
        optimizer_step(optimizer, params, finite=finite, grad_clip=1.0)
        history.append(metrics)
    assert history[0]["loss"] > 1.0 and history[0]["token_accuracy"] < 0.5
    assert history[-1]["loss"] < 0.05 and history[-1]["token_accuracy"] == 1.0, history[-1]


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


GOOD = json.dumps({"messages": [{"role": "user", "content": "hi"}], "response": "hello"})


@pytest.mark.parametrize(
    ("record", "field"),
    [
        ('{"response": "x"}', "messages"),
        ('{"messages": [], "response": "x"}', "messages"),
        ('{"messages": [{"role": "robot", "content": "x"}], "response": "x"}', "messages[0].role"),
        ('{"messages": [{"role": "user", "content": 3}], "response": "x"}', "messages[0].content"),
        ('{"messages": [{"role": "user", "content": "x"}], "response": ""}', "response"),
        ('{"messages": [{"role": "user", "content": "x"}], "response": "y", "metadata": 5}', "metadata"),
        ('{"messages": [{"role": "user", "content": "x"}], "response": "y", "label": 1}', "label"),
        (
            (
                '{"messages": [{"role": "user", "content": "x"}, '
                '{"role": "assistant", "content": "y"}], "response": "z"}'
            ),
            "messages",
        ),
    ],
)
def test_a_malformed_demonstration_names_file_record_and_field(tmp_path, record, field):
    path = _write(tmp_path / "demos.jsonl", [GOOD, record])
    with pytest.raises(DataValidationError) as info:
        load_demonstrations(path)
    message = str(info.value)
    assert str(path) in message and "record 1" in message and f"field {field!r}" in message


def test_demonstration_files_round_trip_and_refuse_non_text(tmp_path):
    demos = [Demonstration([{"role": "user", "content": "hi"}], "hello", {"source": "test"})]
    path = tmp_path / "out" / "demos.jsonl"
    assert save_demonstrations(path, demos) == 1
    assert load_demonstrations(path) == demos
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(bytes(range(128, 256)))
    with pytest.raises(DataValidationError, match=f"{binary}: not UTF-8"):
        load_demonstrations(binary)
    with pytest.raises(DataValidationError, match="line 1 is not valid JSON"):
        load_demonstrations(_write(tmp_path / "bad.jsonl", ["{not json"]))


@pytest.mark.parametrize("call_format", ["hermes", "qwen"])
def test_oracle_demonstrations_execute_and_store_every_fact(tokenizer, call_format):
    instances = generate_synthetic(
        8,
        split="train",
        seed=3,
        num_chunks=3,
        facts_per_chunk=2,
        distractors_per_chunk=1,
        questions_per_instance=2,
        chunk_words=40,
        families=("synth_personal", "synth_timeline", "synth_summary"),
    )
    settings = RolloutSettings(call_format=call_format, max_new_tokens=256, max_prompt_tokens=4096)
    demos = oracle_demonstrations(instances, tokenizer, settings, seed=3)
    assert len(demos) == sum(len(i.chunks) for i in instances)
    fmt = get_call_format(call_format)
    by_instance: dict[str, list[Demonstration]] = {}
    for demo in demos:
        by_instance.setdefault(demo.metadata["instance_id"], []).append(demo)
    for instance in instances:
        memory = Memory()
        for chunk_index, demo in enumerate(by_instance[instance.instance_id]):
            assert demo.metadata["chunk_index"] == chunk_index
            assert instance.chunks[chunk_index] in demo.messages[-1]["content"]  # the rollout's prompt
            parsed = fmt.parse(demo.response)
            assert not parsed.errors and parsed.calls
            assert all(execute_call(memory, call).status == "ok" for call in parsed.calls)
            assert len(tokenizer(demo.response)["input_ids"]) + 1 <= settings.max_new_tokens
        stored = " ".join(entry.content for entry in memory.semantic + memory.episodic)
        for notes in instance.metadata["notes"]:
            for note in notes:
                assert note["fact"].rstrip(".") in stored, (instance.instance_id, note)
                if "date" in note:
                    assert any(
                        note["date"] in e.content and note["fact"].rstrip(".") in e.content
                        for e in memory.episodic
                    )
    responses = {demo.response.split("<tool_call>")[0] for demo in demos} | {
        demo.response[-12:] for demo in demos
    }
    assert len(responses) > 3  # the wording around the calls varies


def test_oracle_replies_leave_headroom_below_the_cap_when_a_shorter_form_exists(tokenizer):
    instances = generate_synthetic(
        6, split="train", seed=5, num_chunks=2, facts_per_chunk=2, distractors_per_chunk=1,
        questions_per_instance=1, chunk_words=40, families=("synth_personal", "synth_timeline"),
    )

    def lengths(cap: int, share: float) -> list[int]:
        settings = RolloutSettings(call_format="hermes", max_new_tokens=cap, max_prompt_tokens=4096)
        demos = oracle_demonstrations(instances, tokenizer, settings, seed=5, reply_share=share)
        return [len(tokenizer(demo.response)["input_ids"]) + 1 for demo in demos]

    # one insert per fact (~170 tokens here) fits 200, the packed form (~85) fits 0.6 of it
    assert max(lengths(200, 1.0)) > 0.6 * 200
    assert max(lengths(200, 0.6)) <= 0.6 * 200
    # no form fits 0.6 of 90: the shortest form that fits the whole cap serves, no error
    assert 0.6 * 90 < max(lengths(90, 0.6)) <= 90
    with pytest.raises(ValueError, match="reply_share must be in"):
        lengths(200, 0.0)


def _sft_config(tmp_path: Path, model_dir: str, demos: Path, max_steps: int) -> Path:
    config = yaml.safe_load((REPO / "configs" / "sft_tiny_cpu.yaml").read_text())
    run = tmp_path / "run"
    config["trainer"].update(max_steps=max_steps, val_check_interval=max_steps)
    config["trainer"]["logger"]["init_args"].update(save_dir=str(run), name="tb", version=None)
    config["trainer"]["callbacks"][0]["init_args"].update(
        dirpath=str(run / "checkpoints"), every_n_train_steps=1
    )
    config["model"].update(model=model_dir, export_adapter_dir=str(run / "adapter"))
    config["data"].update(train_path=str(demos), val_path=str(demos), batch_size=3)
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "sft.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
def demo_file(tmp_path_factory, tokenizer):
    instances = generate_synthetic(
        3,
        split="train",
        seed=0,
        num_chunks=2,
        facts_per_chunk=1,
        questions_per_instance=1,
        chunk_words=20,
        families=("synth_personal",),
    )
    settings = RolloutSettings(call_format="hermes", max_new_tokens=96, max_prompt_tokens=2048)
    path = tmp_path_factory.mktemp("demos") / "train.jsonl"
    save_demonstrations(path, oracle_demonstrations(instances, tokenizer, settings))
    return path


def test_sft_command_trains_logs_resumes_exactly_and_exports_the_adapter(tmp_path, tiny_model_dir, demo_file):
    from peft import PeftModel
    from test_training import scalars, version_dirs
    from transformers import AutoModelForCausalLM

    from memalpha.cli import main

    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    main(["sft", "--config", str(_sft_config(straight, tiny_model_dir, demo_file, max_steps=4))])
    config = _sft_config(resumed, tiny_model_dir, demo_file, max_steps=2)
    main(["sft", "--config", str(config)])
    main(["sft", "--config", str(config), "--trainer.max_steps", "4",
          "--ckpt_path", str(resumed / "run" / "checkpoints" / "last.ckpt")])
    a = scalars(version_dirs(straight)[0])
    for tag in (
        "train/loss", "train/token_accuracy", "perf/tokens_per_s", "val/loss", "val/token_accuracy", "lr",
    ):
        assert tag in a, tag
    assert a["train/loss"][3] < a["train/loss"][0]
    b: dict[str, dict[int, float]] = {}
    for log_dir in version_dirs(resumed):
        for tag, points in scalars(log_dir).items():
            b.setdefault(tag, {}).update(points)
    for tag in ("train/loss", "train/token_accuracy", "lr"):
        assert set(a[tag]) == set(b[tag]) == {0, 1, 2, 3}, tag
        for step in (2, 3):
            assert a[tag][step] == pytest.approx(b[tag][step], rel=1e-4, abs=1e-6), (tag, step)
    adapter = straight / "run" / "adapter"
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), str(adapter))
    assert any("lora_B" in n and p.abs().sum() > 0 for n, p in model.named_parameters())


def test_data_demos_command_writes_demonstrations_for_a_fit_config(tmp_path, tiny_model_dir, capsys):
    from memalpha.cli import main

    config = yaml.safe_load((REPO / "configs" / "tiny_cpu.yaml").read_text())
    config["model"]["model"] = tiny_model_dir
    config["model"]["rollout"]["max_new_tokens"] = 160
    config["data"]["synthetic"]["families"] = ["synth_personal", "synth_timeline"]
    path = tmp_path / "fit.yaml"
    path.write_text(yaml.safe_dump(config))
    out = tmp_path / "demos" / "train.jsonl"
    main(["data", "demos", "--config", str(path), "--out", str(out), "--count", "2"])
    demos = load_demonstrations(out)
    assert len(demos) == 2 * config["data"]["synthetic"]["chunks"]
    assert "wrote 4 demonstrations" in capsys.readouterr().out
    config["model"]["rollout"]["max_new_tokens"] = 16
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(SystemExit) as info:
        main(["data", "demos", "--config", str(path), "--out", str(out), "--count", "2"])
    assert info.value.code == 2
    assert "over rollout.max_new_tokens=16" in capsys.readouterr().err
    assert len(load_demonstrations(out)) == 4  # the failed run left the previous file intact
