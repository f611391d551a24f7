"""Smoke tests of the benchmarks in ``experiments/bench/`` (and two runs that share their kit,
``experiments/checks/soak.py`` and ``experiments/studies/learning_curve.py``): each runs end to end
in a tiny configuration, as a script.

They check the plumbing (real rollouts, a real GRPO update, NF4 loading, the forced-length
generation, the report files, the refused command lines), not the numbers. The benchmarks run one
after another in one child process (``script_probe.py``: the imports are paid once), its
``restored`` probe watching that what a benchmark swaps to time a path is put back.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
import yaml
from conftest import build_tiny_model_dir
from script_probe import REPO, Run, run_probed, run_script

from memalpha_lab import common as _common
from memalpha_lab.bytes_limit import StepShape
from memalpha_lab.qlora_4090 import QWEN3_4B, read_recipe, scaled_shape

BENCH = "experiments/bench"
GRAPH_TINY = ["--device", "cpu", "--tiny"]
RUNS = {  # name -> script and its arguments ({model} and {tiny} filled in; each writes {name}.json)
    "rollout": (f"{BENCH}/bench_rollout.py", ["--smoke", "--model", "{model}"]),
    "graph": (f"{BENCH}/bench_graph_decode.py", [
        *GRAPH_TINY, "--nf4", "--rows", "3", "--prompt-tokens", "24", "--max-new-tokens", "5",
        "--loop-max-new-tokens", "5", "--check-steps", "4", "--paths", "loop,graph", "--sampling", "host",
    ]),
    "graph_hf_static": (f"{BENCH}/bench_graph_decode.py", [
        *GRAPH_TINY, "--rows", "2", "--prompt-tokens", "16", "--max-new-tokens", "6",
        "--loop-max-new-tokens", "4", "--check-steps", "0", "--bucket-columns", "4", "--identical-prompts",
        "--bandwidth", "1e11", "--lora-rank", "4",
    ]),
    "update": (f"{BENCH}/bench_update.py", ["--model", "{model}", "--max-new-tokens", "6", "--repeats", "1"]),
    "scale": (f"{BENCH}/bench_scale.py", ["--smoke"]),
    "profile_share": (f"{BENCH}/profile_grpo_step.py", ["--model", "{tiny}"]),
    "profile_no_share": (f"{BENCH}/profile_grpo_step.py", ["--model", "{tiny}", "--no-share-prefix"]),
    "soak": ("experiments/checks/soak.py", ["--steps", "4", "--val-every", "4", "--model", "{tiny}"]),
}
REFUSED = {  # name -> script, a wrong command line, and what its error names
    "rollout_unknown_engine": (f"{BENCH}/bench_rollout.py", ["--engine", "hf,sglang"], "sglang"),
    "rollout_no_engine": (f"{BENCH}/bench_rollout.py", ["--engine", ","], "--engine"),
    "graph_unknown_path": (f"{BENCH}/bench_graph_decode.py", ["--paths", "loop,turbo"], "turbo"),
    "soak_no_steps": ("experiments/checks/soak.py", ["--steps", "0"], "--steps"),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tokenizer, tiny_model_dir):
    """The command lines of :data:`REFUSED`, then every run of :data:`RUNS`, in one child
    process: name -> its exit code, output, ``restored`` probe and the report it wrote (``report``,
    None when it wrote none)."""
    tmp = tmp_path_factory.mktemp("bench-smoke")
    model_dir = build_tiny_model_dir(tmp / "tiny", tokenizer, hidden=32, layers=2, seed=1)
    # the refused ones get an --out too: should one run, it writes nowhere that matters
    planned = [Run(script, [*args, "--out", tmp / f"{name}.json"])
               for name, (script, args, _) in REFUSED.items()]
    for name, (script, args) in RUNS.items():
        filled = [arg.format(model=model_dir, tiny=tiny_model_dir) for arg in args]
        planned.append(Run(script, [*filled, "--out", tmp / f"{name}.json"]))
    done = run_probed(tmp, planned, probes=["restored"])
    by_name = dict(zip([*REFUSED, *RUNS], done, strict=True))
    for name, run in by_name.items():
        out = tmp / f"{name}.json"
        run["report"] = json.loads(out.read_text()) if out.is_file() else None
    return by_name


def ran(run: dict) -> dict:
    """The report of a run that must have succeeded, once checked that it did and put back what it
    swapped."""
    assert run["code"] == 0, run["stderr"][-3000:]
    assert run["restored"] and all(run["restored"].values()), run["restored"]
    return run["report"]


@pytest.mark.parametrize("name", list(REFUSED))
def test_a_wrong_command_line_is_refused_naming_what_is_wrong(runs, name):
    run, words = runs[name], REFUSED[name][2]
    assert run["code"] == 2 and run["report"] is None
    assert "error:" in run["stderr"] and words in run["stderr"].split("error:")[-1]


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


def test_bench_rollout_smoke(runs):
    written = ran(runs["rollout"])
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
        parts = row["sync_s"] + row["rollout_s"] + row["reader_s"] + row["train_s"]
        assert row["step_s"] == pytest.approx(parts)
    assert written["machine"]["load_average"] is not None


def test_bench_graph_decode_smoke_checks_and_times_both_paths(runs):
    """A tiny NF4 Qwen3 with LoRA: the teacher-forced logits agree, both paths decode every token,
    the step runs eagerly on the CPU, and generation's sampler is put back."""
    written = ran(runs["graph"])
    assert set(written["best"]) == {"loop", "graph"} and written["settings"]["backend_refusal"] is None
    for path, result in written["best"].items():
        assert result["tokens"] == 3 * 5 and result["timed_steps"] == 3, path
        assert result["decode_tokens_per_s"] > 0
    assert written["best"]["graph"]["captured"] is False
    for differences in written["check_relative_difference"].values():
        assert len(differences) == 4 and max(differences) < 1e-4


def test_bench_graph_decode_smoke_times_hf_static_beside_ours_with_the_bytes_limit(runs):
    """Issue 37's comparison at tiny sizes on the CPU: transformers' static-cache generate (not
    compiled here) beside the loop and the bucketed graph, every row one prompt (prefilled once),
    and each result's bytes-read limit computed from its shapes at the bandwidth given."""
    written = ran(runs["graph_hf_static"])
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
    tiny = settings["model_config"]
    assert tiny["hidden_size"] == 64 and tiny["num_hidden_layers"] == 2  # --tiny's shape
    for result in (graph, loop):
        limit = result["bytes_limit"]
        shape = StepShape.of_config(SimpleNamespace(**tiny), weight_dtype_bytes=4, kv_dtype_bytes=4,
                                    filled_tokens=result["mean_filled_tokens"], rows=2)
        assert limit["bytes_read"] == shape.bytes_read and limit["bandwidth_Bps"] == 1e11
        assert limit["fraction"] == pytest.approx(shape.limit_s(1e11) / (result["ms_per_step"] / 1000))


def test_bench_update_smoke_times_the_four_paths_with_the_same_gradients(runs):
    written = ran(runs["update"])
    assert list(written["summary"]) == ["padded", "packed", "streamed", "accumulated"]
    assert len(written["settings"]["response_tokens"]) == 8
    for path in written["summary"].values():  # float32: the same update along every path
        assert path["gradient_relative_difference"] < 1e-4


def test_bench_scale_smoke_forces_full_length_and_steps(runs):
    written = ran(runs["scale"])
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
    assert written["recipe"] == "configs/qlora_4090.yaml"


def test_scaled_shape_keeps_the_structure():
    full = scaled_shape(1.0)
    assert full == QWEN3_4B
    eighth = scaled_shape(0.125)
    assert eighth["num_hidden_layers"] == 4 and eighth["hidden_size"] == 320
    assert eighth["num_attention_heads"] == 4 and eighth["num_key_value_heads"] == 1
    assert eighth["vocab_size"] == 151936 and eighth["head_dim"] == 128
    with pytest.raises(ValueError):
        scaled_shape(0.0)


def test_recipe_values_come_from_the_qlora_config():
    recipe = read_recipe()
    assert (recipe["group_size"], recipe["prompt_tokens"], recipe["response_tokens"]) == (8, 6144, 2048)
    lora = recipe["lora"]
    assert lora.r == 32 and lora.alpha == 64 and lora.target_modules == "all-linear"
    assert recipe["optimizer"] == "paged_adamw_8bit" and recipe["gradient_checkpointing"] is True


@pytest.mark.parametrize("share", [True, False])
def test_profile_grpo_step_smoke(runs, share):
    saved = ran(runs["profile_share" if share else "profile_no_share"])
    assert saved["share_prefix"] is share and saved["generated_tokens"] > 0
    phases = {"generate", "reference_logprobs", "policy_loss_backward", "optimizer_step"}
    assert set(saved["phases_s"]) == phases
    assert all(seconds > 0 for seconds in saved["phases_s"].values())
    assert len(saved["top_ops_self_cpu_s"]) == 10


def test_learning_curve_smoke(tmp_path, tiny_model_dir):
    """The whole benchmark (demonstrations, partial SFT, start validation, GRPO validated every
    step) through the real commands, on a tiny random model: the report and plot it writes."""
    fit = yaml.safe_load((REPO / "configs" / "tiny_cpu.yaml").read_text())
    fit["model"]["model"] = tiny_model_dir
    fit["model"]["reader"].update(max_new_tokens=4, batch_size=4)
    fit["data"]["synthetic"]["val"] = 2
    fit["data"]["val_batch_size"] = 2
    sft = yaml.safe_load((REPO / "configs" / "sft_tiny_cpu.yaml").read_text())
    sft["model"]["model"] = tiny_model_dir
    sft["data"].update(batch_size=2, val_batch_size=2)
    sft["model"]["micro_batch_size"] = 2
    (tmp_path / "fit.yaml").write_text(yaml.safe_dump(fit))
    (tmp_path / "sft.yaml").write_text(yaml.safe_dump(sft))
    out = tmp_path / "curve.json"
    done = run_script(
        "experiments/studies/learning_curve.py", "--config", tmp_path / "fit.yaml",
        "--sft-config", tmp_path / "sft.yaml", "--demos", "2", "--sft-steps", "1", "--steps", "2",
        "--every", "1", "--val", "2", "--run-dir", tmp_path / "run", "--out", out,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    (run,) = report["seeds"]
    assert [point["step"] for point in run["curve"]] == [0, 1, 2]
    for point in run["curve"]:
        assert point["metrics"]["all"]["mean_reward"]["n"] == 2  # two held-out instances, each a sample
    assert set(run["change_last_minus_start"]) == {"accuracy", "tool_success", "memory_tokens", "compression",
                                                   "mean_reward"}
    assert sorted(run["train"]["train/reward"]) == ["0", "1"]  # JSON keys
    assert out.with_suffix(".png").stat().st_size > 0
    refused = run_script("experiments/studies/learning_curve.py", "--steps", "5", "--every", "2")
    assert refused.returncode == 2 and "--every" in refused.stderr


def test_soak_smoke_records_every_step_and_writes_the_report(runs):
    soak = runs["soak"]
    written = soak["report"]
    assert written is not None, soak["stderr"][-3000:]
    records = written["records"]
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    assert [r["global_step"] for r in records] == [1, 2, 3, 4]
    assert all(r["rss_bytes"] > 2**20 and r["fds"] > 2 and r["threads"] >= 1 for r in records)
    assert all(r["step_s"] > 0 for r in records)
    summary = written["summary"]
    assert summary["steps"] == 4 and summary["warmup_steps"] == 1
    goal = summary["rss_growth_percent"] < 5 and summary["fds_end"] <= summary["fds_after_warmup"]
    assert summary["passed"] == goal
    assert soak["code"] == (0 if goal else 1)  # the exit status says whether the goal was met
    assert written["machine"]["load_average"] is not None
