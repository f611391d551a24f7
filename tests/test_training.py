"""End-to-end `memalpha fit` / `memalpha validate` runs on a tiny random model (and one on the embedded
model)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import randomise_lora_b

from memalpha.cli import main

REPO = Path(__file__).resolve().parents[1]

REQUIRED_SCALARS = [
    "train/reward",
    "train/reward_std",
    "train/frac_reward_zero_std",
    "train/kl",
    "train/loss",
    "train/clip_ratio/low",
    "train/clip_ratio/high",
    "train/entropy",
    "train/response_length",
    "train/truncated_ratio",
    "train/tool_calls_per_turn",
    "train/tool_success",
    "rewards/r1_accuracy",
    "rewards/r2_tool",
    "rewards/r3_compression",
    "rewards/r4_content",
    "memory/tokens",
    "reader/failures",
    "reader/failed_calls",
    "perf/rollout_s",
    "perf/reader_s",
    "perf/train_s",
    "perf/gen_tokens_per_s",
    "lr",
]


def write_config(tmp_path: Path, model_dir: str, *, max_steps: int = 2, **data_overrides) -> Path:
    """tiny_cpu.yaml, shrunk for tests and pointed at a temporary run folder."""
    config = yaml.safe_load((REPO / "configs" / "tiny_cpu.yaml").read_text())
    run = tmp_path / "run"
    config["trainer"].update(max_steps=max_steps, val_check_interval=max_steps, limit_val_batches=1)
    config["trainer"]["logger"]["init_args"].update(save_dir=str(run), name="tb", version=None)
    config["trainer"]["callbacks"][0]["init_args"].update(
        dirpath=str(run / "checkpoints"), every_n_train_steps=1
    )
    config["model"].update(model=model_dir, log_text_every_n_steps=1)
    config["model"]["reader"].update(max_new_tokens=6)
    config["model"]["update"].update(micro_batch_size=3)
    config["model"]["rollout"].update(group_size=2, max_new_tokens=12, max_prompt_tokens=2048)
    config["data"]["synthetic"].update(train=8, val=2, chunks=2, questions=2, chunk_words=30)
    config["data"].update(instances_per_step=2, val_batch_size=2)
    config["data"].update(data_overrides)
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def scalars(log_dir: Path) -> dict[str, dict[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


def version_dirs(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "run" / "tb").glob("version_*"), key=lambda p: int(p.name.split("_")[1]))


@pytest.fixture(scope="module")
def fitted(tmp_path_factory, tiny_model_dir):
    """One short fit on the tiny model, shared by the checks below."""
    tmp_path = tmp_path_factory.mktemp("fit")
    config = write_config(tmp_path, tiny_model_dir, max_steps=2)
    main(["fit", "--config", str(config)])
    return tmp_path, config


def test_fit_logs_every_metric_and_sample_text(fitted):
    tmp_path, _ = fitted
    log_dir = version_dirs(tmp_path)[0]
    values = scalars(log_dir)
    missing = [tag for tag in REQUIRED_SCALARS if tag not in values]
    assert not missing, f"metrics not logged: {missing}"
    assert set(values["train/loss"]) == {0, 1}
    assert all(math.isfinite(v) for tag in REQUIRED_SCALARS for v in values[tag].values()), (
        "non-finite metric"
    )
    assert "val/accuracy" in values
    assert set(values["val/reader_failures"].values()) == {0.0}  # the local reader cannot fail

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"tensors": 0})
    acc.Reload()
    text_tags = [t for t in acc.Tags()["tensors"] if t.startswith("rollout/sample")]
    assert text_tags, acc.Tags()
    text = acc.Tensors(text_tags[0])[0].tensor_proto.string_val[0].decode()
    assert "final memory" in text and "chunk 0" in text
    [backends] = [t for t in acc.Tags()["tensors"] if t.startswith("run/backends")]
    said = acc.Tensors(backends)[0].tensor_proto.string_val[0].decode()
    assert said == "policy cpu-fused, reader cpu-fused"


def test_checkpoint_holds_adapter_optimizer_and_stream_state(fitted):
    tmp_path, _ = fitted
    ckpt = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=False)
    keys = list(ckpt["state_dict"])
    assert keys and all("lora_" in k for k in keys), keys[:5]
    assert ckpt["global_step"] == 2
    assert ckpt["optimizer_states"] and ckpt["lr_schedulers"]
    stream = ckpt["RolloutDataModule"]
    assert stream["round"] == 2 and stream["cursor"] == 4


def test_exported_adapter_loads_with_plain_peft(fitted, tiny_model_dir):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    tmp_path, _ = fitted
    adapter = version_dirs(tmp_path)[0] / "adapter"
    assert (adapter / "adapter_config.json").is_file()
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model = PeftModel.from_pretrained(base, str(adapter))
    ckpt = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=False)
    name, trained = next(iter(ckpt["state_dict"].items()))
    loaded = dict(model.named_parameters())[name.removeprefix("policy.")]
    assert torch.allclose(loaded, trained)


def test_validate_prints_table_and_writes_json(fitted, capsys):
    tmp_path, config = fitted
    main(
        [
            "validate",
            "--config",
            str(config),
            "--ckpt_path",
            str(tmp_path / "run" / "checkpoints" / "last.ckpt"),
        ]
    )
    out = capsys.readouterr().out
    assert "source" in out and "accuracy" in out and "ALL" in out
    assert "sampled by policy cpu-fused, reader cpu-fused" in out  # what ran, said under the table
    report = json.loads((version_dirs(tmp_path)[-1] / "validation.json").read_text())
    assert report["summary"]["overall"]["questions"] > 0
    assert report["summary"]["backends"] == {"sampling": "cpu-fused", "reader": "cpu-fused"}
    scoring = report["summary"]["settings"]["scoring"]  # what memalpha compare checks
    assert scoring["model.reader.kind"] == "local" and scoring["model.reader.model"] == scoring["model.model"]
    question = report["records"][0]["questions"][0]
    assert {"question", "gold", "prediction", "score"} <= set(question)


def test_resume_equals_uninterrupted_run(tmp_path, tiny_model_dir):
    straight = tmp_path / "straight"
    resumed = tmp_path / "resumed"
    main(["fit", "--config", str(write_config(straight, tiny_model_dir, max_steps=4))])
    config = write_config(resumed, tiny_model_dir, max_steps=2)
    main(["fit", "--config", str(config)])
    ckpt = resumed / "run" / "checkpoints" / "last.ckpt"
    main(["fit", "--config", str(config), "--trainer.max_steps", "4", "--ckpt_path", str(ckpt)])

    a = scalars(version_dirs(straight)[0])
    b = {}
    for log_dir in version_dirs(resumed):
        for tag, points in scalars(log_dir).items():
            b.setdefault(tag, {}).update(points)
    for tag in ("train/reward", "train/loss", "train/kl", "rewards/r1_accuracy", "memory/tokens", "lr"):
        assert set(a[tag]) == set(b[tag]) == {0, 1, 2, 3}, tag
        for step in (2, 3):
            assert a[tag][step] == pytest.approx(b[tag][step], rel=1e-4, abs=1e-6), (tag, step)


def test_corrupt_data_fails_before_training(tmp_path, tiny_model_dir):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        json.dumps({"instance_id": "a", "data_source": "squad", "chunks": [], "questions": []}) + "\n"
    )
    config = write_config(tmp_path, tiny_model_dir, max_steps=2, train_path=str(bad))
    with pytest.raises(SystemExit) as info:  # one line naming the file, the record and the field
        main(["fit", "--config", str(config)])
    message = str(info.value)
    assert message.startswith(f"memalpha fit: error: {bad}") and "chunks" in message
    assert not (tmp_path / "run" / "checkpoints").exists()


def nonzero_adapter(tmp_path: Path, model_dir: str) -> Path:
    """A LoRA adapter with random B, so the policy differs from the reference and the KL term has a
    gradient."""
    from memalpha.lm.core.policy import LoraSettings, load_policy

    policy, _ = load_policy(model_dir, lora=LoraSettings(r=8, alpha=16))
    torch.manual_seed(1)
    randomise_lora_b(policy, 0.5)
    out = tmp_path / "start-adapter"
    policy.save_pretrained(out)
    return out


def test_ddp_two_ranks_train_different_instances_with_identical_adapters(tmp_path, tiny_model_dir):
    # A random tiny model earns the same reward on every rollout (zero advantages), so the
    # gradient here comes from the KL to the reference: rank-specific data, hence rank-specific
    # gradients, which only DDP's all-reduce can keep in step.
    start = nonzero_adapter(tmp_path, tiny_model_dir)
    config = write_config(tmp_path, tiny_model_dir, max_steps=2, instances_per_step=1)
    probe_dir = tmp_path / "probe"
    env = dict(os.environ, PYTHONPATH=str(REPO / "tests"), HF_HUB_OFFLINE="1")
    cmd = [
        str(Path(sys.executable).with_name("memalpha")),  # the console script: its exit code must be 0
        "fit",
        "--config",
        str(config),
        "--trainer.devices",
        "2",
        "--trainer.strategy",
        "ddp",
        "--trainer.callbacks+=ddp_probe.RankProbe",
        f"--trainer.callbacks.out_dir={probe_dir}",
        f"--model.adapter_path={start}",
        "--model.update.kl_coef=0.5",
    ]
    proc = subprocess.run(
        cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    rank0 = torch.load(probe_dir / "rank0.pt", weights_only=False)
    rank1 = torch.load(probe_dir / "rank1.pt", weights_only=False)
    assert rank0["world"] == rank1["world"] == 2
    assert rank0["instances"] and rank1["instances"]
    assert not set(rank0["instances"]) & set(rank1["instances"])
    assert rank0["lora"].keys() == rank1["lora"].keys()
    from safetensors.torch import load_file

    initial = load_file(start / "adapter_model.safetensors")
    assert any(not torch.equal(value, initial[_peft_key(name)]) for name, value in rank0["lora"].items()), (
        "adapters did not train"
    )
    for name, value in rank0["lora"].items():
        assert torch.equal(value, rank1["lora"][name]), name


def _peft_key(parameter_name: str) -> str:
    """PEFT's saved key for a live parameter name (the adapter name is dropped)."""
    return parameter_name.replace(".default", "")


@pytest.mark.embedded
def test_embedded_model_fit_one_step_then_validate(tmp_path, embedded_model_dir, capsys):
    """The real default model through the whole CLI: one GRPO step, then validation from the checkpoint
    (the fit itself validates nothing: the tiny model's fits check that)."""
    config = write_config(tmp_path, "smollm2-135m-instruct", max_steps=1, instances_per_step=1)
    main(["fit", "--config", str(config), "--model.rollout.max_new_tokens", "24",
          "--trainer.limit_val_batches", "0"])
    values = scalars(version_dirs(tmp_path)[0])
    assert values["train/response_length"][0] > 0
    assert math.isfinite(values["train/loss"][0]) and values["train/skipped_nonfinite"][0] == 0.0
    main(
        [
            "validate",
            "--config",
            str(config),
            "--ckpt_path",
            str(tmp_path / "run" / "checkpoints" / "last.ckpt"),
        ]
    )
    assert "ALL" in capsys.readouterr().out
