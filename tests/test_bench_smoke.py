"""Smoke tests of the benchmarks in ``experiments/bench/``: each runs end to end in a tiny configuration.

They check the plumbing (real rollouts, a real GRPO update, NF4 loading, the forced-length
generation, the report files), not the numbers.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import build_tiny_model_dir

EXPERIMENTS = Path(__file__).resolve().parent.parent / "experiments" / "bench"
sys.path[:0] = [str(EXPERIMENTS), str(EXPERIMENTS.parent / "studies"), str(EXPERIMENTS.parent / "checks")]

import bench_decode
import bench_graph_decode
import bench_rollout
import bench_scale
import bench_update

from memalpha.lab import common as _common


@pytest.fixture
def one_thread():
    """Tiny models gain nothing from more threads, and on a shared, busy machine they lose a lot."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def test_format_table_aligns_numbers_right_and_text_left():
    table = _common.format_table(("name", "value"), [["a", 1.5], ["longer", 12.25]])
    lines = table.splitlines()
    assert lines == ["name    value", "------  -----", "a        1.50", "longer  12.25"]


def test_write_json_is_atomic_and_records_the_machine(tmp_path):
    target = tmp_path / "results" / "x.json"
    _common.write_json({"a": 1}, target)
    data = json.loads(target.read_text())
    assert data["a"] == 1
    machine = data["machine"]
    for key in ("torch", "torch_threads", "cpu_count", "load_average", "load_average_end", "commit"):
        assert key in machine
    assert list(target.parent.iterdir()) == [target]  # no temporary file left behind

    class Unserialisable:
        pass

    with pytest.raises(TypeError):
        _common.write_json({"a": Unserialisable()}, target)
    assert json.loads(target.read_text())["a"] == 1  # the old report survives a failed write
    assert list(target.parent.iterdir()) == [target]


def test_bench_rollout_smoke(tmp_path, tokenizer, one_thread):
    model_dir = build_tiny_model_dir(tmp_path / "tiny", tokenizer, hidden=32, layers=2, seed=1)
    out = tmp_path / "bench_rollout.json"
    report = bench_rollout.main(["--smoke", "--model", model_dir, "--out", str(out)])
    written = json.loads(out.read_text())
    assert written["complete"] is True
    rows = written["results"]
    assert [(r["group_size"], r["instances"]) for r in rows] == [(2, 1)]
    for row in rows:
        assert row["rollouts"] == row["group_size"] * row["instances"]
        assert row["turns"] == row["rollouts"]  # one chunk per instance in the smoke configuration
        assert 0 < row["generated_tokens"] <= 4 * row["turns"]
        assert row["questions"] == row["rollouts"]  # one question per instance
        assert row["tokens_per_s"] > 0 and row["questions_per_s"] > 0
        assert sum(row["share"].values()) == pytest.approx(1.0)
        assert row["engine"] == "hf" and row["sampler_logprob_gap"] is None
        assert row["step_s"] == pytest.approx(row["sync_s"] + row["rollout_s"] + row["reader_s"] + row["train_s"])
    assert report["machine"]["load_average"] is not None


def test_bench_decode_smoke_times_every_path_and_restores_generation(tmp_path, tokenizer, one_thread):
    from memalpha.lm.sampling import generation, packed_linear

    before = (generation.decode, generation.fused_decode, generation.FusedDecoder)
    packing = packed_linear.packing_available
    model_dir = build_tiny_model_dir(tmp_path / "tiny", tokenizer, hidden=32, layers=2, seed=1)
    out = tmp_path / "bench_decode.json"
    bench_decode.main(["--model", model_dir, "--max-new-tokens", "3", "--repeats", "1", "--out", str(out)])
    written = json.loads(out.read_text())
    assert set(written["summary"]) == {"peft", "folded", "fused", "fused_plain"}
    for records in written["runs"].values():
        (record,) = records
        assert record["tokens"] == 8 * 3  # 2 prompts x 4 rows, no row stops early
        assert 0 < record["decode_s"] < record["total_s"]
    assert (generation.decode, generation.fused_decode, generation.FusedDecoder) == before
    assert packed_linear.packing_available is packing
    with pytest.raises(SystemExit):
        bench_decode.parse_args(["--paths", "peft,turbo"])


def test_bench_graph_decode_smoke_checks_and_times_both_paths(tmp_path, one_thread):
    """A tiny NF4 Qwen3 with LoRA: the teacher-forced logits agree, both paths decode every token,
    the step runs eagerly on the CPU, and generation's sampler is put back."""
    from memalpha.lm.sampling import generation
    from memalpha.lm.sampling.filters import next_tokens

    out = tmp_path / "bench_graph_decode.json"
    bench_graph_decode.main([
        "--device", "cpu", "--tiny", "--nf4", "--rows", "3", "--prompt-tokens", "24", "--max-new-tokens", "5",
        "--loop-max-new-tokens", "5", "--check-steps", "4", "--paths", "loop,graph", "--sampling", "host",
        "--out", str(out),
    ])
    written = json.loads(out.read_text())
    assert set(written["best"]) == {"loop", "graph"} and written["settings"]["backend_refusal"] is None
    for path, result in written["best"].items():
        assert result["tokens"] == 3 * 5 and result["timed_steps"] == 3, path
        assert result["decode_tokens_per_s"] > 0
    assert written["best"]["graph"]["captured"] is False
    for differences in written["check_relative_difference"].values():
        assert len(differences) == 4 and max(differences) < 1e-4
    assert generation.next_tokens is next_tokens
    with pytest.raises(SystemExit):
        bench_graph_decode.parse_args(["--paths", "loop,turbo"])


def test_bench_graph_decode_smoke_times_hf_static_beside_ours_with_the_bytes_limit(tmp_path, one_thread):
    """Issue 37's comparison at tiny sizes on the CPU: transformers' static-cache generate (not
    compiled here) beside the loop and the bucketed graph, every row one prompt (prefilled once),
    and each result's bytes-read limit computed from its shapes at the bandwidth given."""
    from bench_graph_decode import TINY

    from memalpha.lm.sampling.bytes_limit import StepShape

    out = tmp_path / "bench_graph_decode.json"
    bench_graph_decode.main([
        "--device", "cpu", "--tiny", "--rows", "2", "--prompt-tokens", "16", "--max-new-tokens", "6",
        "--loop-max-new-tokens", "4", "--check-steps", "0", "--bucket-columns", "4", "--identical-prompts",
        "--bandwidth", "1e11", "--lora-rank", "4", "--out", str(out),
    ])
    written = json.loads(out.read_text())
    assert set(written["best"]) == {"loop", "graph", "hf-static"}
    settings = written["settings"]
    assert settings["bucket_columns"] == 4 and settings["identical_prompts"]
    assert settings["hf_weights"] == "folded"
    graph, hf, loop = written["best"]["graph"], written["best"]["hf-static"], written["best"]["loop"]
    assert graph["tokens"] == hf["tokens"] == 2 * 6 and loop["tokens"] == 2 * 4
    # in-graph sampling (the default, what generate runs) runs the last prompt column as its first
    # step: widths 16 (16 columns filled), 20 (17 to 20) and 22 (21 and 22; the capacity)
    assert graph["graphs"] == 3
    assert hf["timed_steps"] == 5 and hf["compiled"] is False and hf["mean_filled_tokens"] == 16 + 1 + 2
    assert graph["sampling"] == "in-graph" and graph["timed_steps"] == 6  # every step is timed
    assert graph["mean_filled_tokens"] == 16 + 2.5
    for result in (graph, loop):
        limit = result["bytes_limit"]
        shape = StepShape.of_config(SimpleNamespace(**TINY), weight_dtype_bytes=4, kv_dtype_bytes=4,
                                    filled_tokens=result["mean_filled_tokens"], rows=2)
        assert limit["bytes_read"] == shape.bytes_read and limit["bandwidth_Bps"] == 1e11
        assert limit["fraction"] == pytest.approx(shape.limit_s(1e11) / (result["ms_per_step"] / 1000))


def test_bench_update_smoke_times_the_four_paths_with_the_same_gradients(tmp_path, tokenizer, one_thread):
    from memalpha.lm.core import prefix_cache
    from memalpha.lm.scoring import logprobs

    def switches():
        return (logprobs.packed_response_hidden, logprobs.streams_head, logprobs.accumulated_adapters,
                prefix_cache.accumulated_adapters)

    before = switches()
    model_dir = build_tiny_model_dir(tmp_path / "tiny", tokenizer, hidden=32, layers=2, seed=1)
    out = tmp_path / "bench_update.json"
    bench_update.main(["--model", model_dir, "--max-new-tokens", "6", "--repeats", "1", "--out", str(out)])
    written = json.loads(out.read_text())
    assert list(written["summary"]) == ["padded", "packed", "streamed", "accumulated"]
    assert len(written["settings"]["response_tokens"]) == 8
    for path in written["summary"].values():  # float32: the same update along every path
        assert path["gradient_relative_difference"] < 1e-4
    assert switches() == before


def test_bench_rollout_engine_list_is_checked():
    with pytest.raises(SystemExit):
        bench_rollout.main(["--engine", "hf,sglang"])
    with pytest.raises(ValueError, match="engines must be"):
        bench_rollout.run_benchmark(engines=[], out=None)


def test_bench_scale_smoke_forces_full_length_and_steps(tmp_path, one_thread):
    out = tmp_path / "bench_scale.json"
    report = bench_scale.main(["--smoke", "--out", str(out)])
    written = json.loads(out.read_text())
    assert written["status"] == "ok"
    assert written["device"] == "cpu"
    assert written["shape"]["num_attention_heads"] == 4 * written["shape"]["num_key_value_heads"]
    assert written["shape"]["head_dim"] == 128 and written["shape"]["tie_word_embeddings"] is True
    step = written["step"]
    assert step["generated_tokens"] == written["group_size"] * written["response_tokens"]  # no early stop
    assert step["optimizer"] == "adamw"
    assert step["trainable_parameters"] > 0 and torch.isfinite(torch.tensor(step["grad_norm"]))
    phases = {p["phase"]: p for p in written["phases"]}
    assert set(phases) == {"load", "generate", "reference", "policy_forward", "backward", "optimizer"}
    assert all(p["seconds"] > 0 and p["peak_rss_gib"] > 0 for p in phases.values())
    assert sum(written["time_share"].values()) == pytest.approx(1.0)
    assert report["recipe"] == "configs/qlora_4090.yaml"


def test_scaled_shape_keeps_the_structure():
    full = bench_scale.scaled_shape(1.0)
    assert full == bench_scale.QWEN3_4B
    eighth = bench_scale.scaled_shape(0.125)
    assert eighth["num_hidden_layers"] == 4 and eighth["hidden_size"] == 320
    assert eighth["num_attention_heads"] == 4 and eighth["num_key_value_heads"] == 1
    assert eighth["vocab_size"] == 151936 and eighth["head_dim"] == 128
    with pytest.raises(ValueError):
        bench_scale.scaled_shape(0.0)


def test_recipe_values_come_from_the_qlora_config():
    recipe = bench_scale.read_recipe()
    assert (recipe["group_size"], recipe["prompt_tokens"], recipe["response_tokens"]) == (8, 6144, 2048)
    assert recipe["lora"].r == 32 and recipe["lora"].alpha == 64 and recipe["lora"].target_modules == "all-linear"
    assert recipe["optimizer"] == "paged_adamw_8bit" and recipe["gradient_checkpointing"] is True


@pytest.mark.parametrize("share", [True, False])
def test_profile_grpo_step_smoke(tmp_path, tiny_model_dir, one_thread, share):
    import profile_grpo_step

    out = tmp_path / "profile.json"
    report = profile_grpo_step.main(["--model", tiny_model_dir, "--out", str(out)] + ([] if share else ["--no-share-prefix"]))
    saved = json.loads(out.read_text())
    assert saved["share_prefix"] is share and saved["generated_tokens"] == report["generated_tokens"] > 0
    assert set(saved["phases_s"]) == set(profile_grpo_step.PHASES)
    assert all(seconds > 0 for seconds in saved["phases_s"].values())
    assert len(saved["top_ops_self_cpu_s"]) == 10


def test_learning_curve_smoke(tmp_path, tiny_model_dir, monkeypatch):
    """The whole benchmark (demonstrations, partial SFT, start validation, GRPO validated every
    step) through the real commands, on a tiny random model: the report and plot it writes."""
    import learning_curve
    import yaml

    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the commands' processes: see one_thread

    repo = EXPERIMENTS.parents[1]
    fit = yaml.safe_load((repo / "configs" / "tiny_cpu.yaml").read_text())
    fit["model"]["model"] = tiny_model_dir
    fit["model"]["reader"].update(max_new_tokens=4, batch_size=4)
    fit["data"]["synthetic"]["val"] = 2
    fit["data"]["val_batch_size"] = 2
    sft = yaml.safe_load((repo / "configs" / "sft_tiny_cpu.yaml").read_text())
    sft["model"]["model"] = tiny_model_dir
    sft["data"].update(batch_size=2, val_batch_size=2)
    sft["model"]["micro_batch_size"] = 2
    (tmp_path / "fit.yaml").write_text(yaml.safe_dump(fit))
    (tmp_path / "sft.yaml").write_text(yaml.safe_dump(sft))
    out = tmp_path / "curve.json"
    learning_curve.main([
        "--config", str(tmp_path / "fit.yaml"), "--sft-config", str(tmp_path / "sft.yaml"), "--demos", "2",
        "--sft-steps", "1", "--steps", "2", "--every", "1", "--val", "2", "--run-dir", str(tmp_path / "run"),
        "--out", str(out),
    ])
    report = json.loads(out.read_text())
    (run,) = report["seeds"]
    assert [point["step"] for point in run["curve"]] == [0, 1, 2]
    for point in run["curve"]:
        assert point["metrics"]["all"]["mean_reward"]["n"] == 2  # two held-out instances, each a sample
    assert set(run["change_last_minus_start"]) == {"accuracy", "tool_success", "memory_tokens", "compression",
                                                   "mean_reward"}
    assert sorted(run["train"]["train/reward"]) == ["0", "1"]  # JSON keys
    assert out.with_suffix(".png").stat().st_size > 0
    with pytest.raises(SystemExit):
        learning_curve.main(["--steps", "5", "--every", "2"])


def test_soak_smoke_records_every_step_and_writes_the_report(tmp_path, tiny_model_dir, one_thread):
    import soak

    out = tmp_path / "soak.json"
    report = soak.main(["--steps", "4", "--val-every", "4", "--model", tiny_model_dir, "--out", str(out)])
    written = json.loads(out.read_text())
    records = written["records"]
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    assert [r["global_step"] for r in records] == [1, 2, 3, 4]
    assert all(r["rss_bytes"] > 2**20 and r["fds"] > 2 and r["threads"] >= 1 for r in records)
    assert all(r["step_s"] > 0 for r in records)
    summary = written["summary"]
    assert summary["steps"] == 4 and summary["warmup_steps"] == 1
    goal = summary["rss_growth_percent"] < 5 and summary["fds_end"] <= summary["fds_after_warmup"]
    assert summary["passed"] == goal
    assert report["summary"] == summary and written["machine"]["load_average"] is not None
    with pytest.raises(SystemExit):
        soak.main(["--steps", "0"])
