"""Smoke test of experiments/bench/bench_vs_trl.py: one step of each side on a tiny random model,
the script run as it is run; and its job (experiments/lab/memalpha_lab/vs_trl_job.py) and timing report
(experiments/lab/memalpha_lab/vs_trl_report.py).

The TRL side needs the ``bench`` extra. With TRL installed one invocation runs both sides;
without it that test skips (saying so) and a memalpha-only run is checked instead, so exactly
one benchmark invocation runs either way (each side is a subprocess that loads torch, which
dominates the test's time).
"""

from __future__ import annotations

import importlib.util
import json

import pytest
from script_probe import run_script

from memalpha_lab.vs_trl_job import (
    BenchSettings,
    build_job,
    build_prompts,
    memory_job_reward,
    tool_call_validity,
)
from memalpha_lab.vs_trl_report import learning_summary

SCRIPT = "experiments/bench/bench_vs_trl.py"
HAS_TRL = importlib.util.find_spec("trl") is not None
TINY = [
    "--prompts-per-step", "1", "--group-size", "2", "--micro-batch-size", "1",
    "--max-new-tokens", "6", "--steps", "1", "--repeats", "1",
]


def test_tool_call_validity_counts_failed_and_parse_errors():
    ok = (
        '<tool_call>\n{"name": "new_memory_insert", "arguments": '
        '{"memory_type": "semantic_memory", "content": "x"}}\n</tool_call>'
    )
    bad_type = (
        '<tool_call>{"name": "new_memory_insert", "arguments": '
        '{"memory_type": "nope", "content": "x"}}</tool_call>'
    )
    broken = '<tool_call>{"name": "new_memory_insert", "arguments": {"content": "cut'
    rewards = tool_call_validity([ok, ok + bad_type, "no call here", ok + broken, broken])
    assert rewards == [1.0, 0.5, 0.0, 0.5, 0.0]


def test_prompts_are_one_chunk_memorise_turns():
    prompts = build_prompts(3, seed=0, response_token_limit=48)
    assert len(prompts) == 3
    assert [m["role"] for m in prompts[0]] == ["system", "user"]
    assert "<tool_call>" in prompts[0][0]["content"]
    assert len({p[1]["content"] for p in prompts}) == 3


def test_settings_are_validated():
    with pytest.raises(ValueError, match="group_size"):
        BenchSettings(group_size=1).validate()


def _check_side(summary: dict, run: dict) -> None:
    assert summary["runs"] == 1 and summary["steps_kept"] == 1  # one step: nothing dropped
    (step,) = run["steps"]
    assert 0 < step["gen_s"] <= step["step_s"]
    assert 2 <= step["generated_tokens"] <= 2 * 6
    assert summary["peak_rss_mib"] >= summary["rss_after_import_mib"] > 0


@pytest.mark.skipif(HAS_TRL, reason="TRL is installed: test_both_sides_one_step runs this side too")
def test_memalpha_side_one_step(tiny_model_dir, tmp_path):
    out = tmp_path / "bench.json"
    done = run_script(SCRIPT, "--model", tiny_model_dir, *TINY, "--sides", "memalpha", "--out", out)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["ratio_memalpha_over_trl"] is None and report["complete"]
    _check_side(report["summary"]["memalpha"], report["runs"]["memalpha"][0])
    assert report["machine"]["load_average"] is not None and report["order"] == ["memalpha"]


@pytest.mark.skipif(not HAS_TRL, reason="TRL is not installed (it is the optional 'bench' extra)")
def test_both_sides_one_step(tiny_model_dir, tmp_path):
    out = tmp_path / "bench.json"
    done = run_script(SCRIPT, "--model", tiny_model_dir, *TINY, "--out", out)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["order"] == ["memalpha", "trl"] and report["complete"]
    for side in ("memalpha", "trl"):
        _check_side(report["summary"][side], report["runs"][side][0])
    ratio = report["ratio_memalpha_over_trl"]
    assert ratio["step_s_median"] == pytest.approx(
        report["summary"]["memalpha"]["step_s_median"] / report["summary"]["trl"]["step_s_median"]
    )
    assert "memalpha/trl" in done.stdout and f"wrote {out}" in done.stdout


def test_memory_job_rewards_validity_plus_the_share_of_facts_stored():
    insert = (
        '<tool_call>\n{{"name": "new_memory_insert", "arguments": '
        '{{"memory_type": "episodic_memory", "content": "{}"}}}}\n</tool_call>'
    )
    facts = ["Ada moves to Oslo.", "Bo buys a red bike."]
    both = insert.format("2024-01-02: ada moves to  Oslo. Bo buys a red bike")
    one = (
        insert.format("Ada moves to Oslo.")
        + '<tool_call>{"name": "memory_delete", "arguments": {}}</tool_call>'
    )
    rewards = memory_job_reward([both, one, "nothing"], [facts, facts, facts])
    assert rewards == [2.0, 0.5 + 0.5, 0.0]


def test_memory_job_prompts_are_compact_with_the_chunk_facts():
    job = build_job(3, seed=0, response_token_limit=112, job="memory")
    assert len(job) == 3
    for messages, facts in job:
        assert len(facts) == 2  # configs/tiny_cpu.yaml: 2 facts per chunk, no distractors
        assert [m["role"] for m in messages] == ["system", "user"]
    full = build_job(1, seed=0, response_token_limit=112, job="validity")[0][0]
    assert len(job[0][0][0]["content"]) < len(full[0]["content"])  # the compact profile


def _run(rewards):
    return {"steps": [{"reward": r} for r in rewards]}


def test_learning_summary_describes_the_curves():
    runs = {"memalpha": [_run([0.0, 1.0, 2.0, 3.0]), _run([1.0, 1.0, 1.0, 1.0])],
            "trl": [_run([0.0, 0.0, 2.0, 2.0]), _run([0.0, 0.0, 1.0, 1.0])]}
    learning = learning_summary(runs, steps=4)
    mem = learning["sides"]["memalpha"]
    assert mem["reward_per_step_mean"] == [0.5, 1.0, 1.5, 2.0]
    assert (
        mem["reward_per_step_min"] == [0.0, 1.0, 1.0, 1.0]
        and mem["reward_per_step_max"] == [1.0, 1.0, 2.0, 3.0]
    )
    assert mem["final_window_per_run"] == [2.5, 1.0] and mem["final_window_mean"] == 1.75
    assert "parity" not in learning  # the verdict is the parity mode's (tests/test_parity_check.py)


def test_an_adapter_start_needs_an_adapter_folder(tmp_path):
    with pytest.raises(ValueError, match="not a PEFT adapter folder"):
        BenchSettings(adapter_path=str(tmp_path)).validate()
    (tmp_path / "adapter_config.json").write_text("{}")
    BenchSettings(adapter_path=str(tmp_path), kl_coef=0.04).validate()


def test_parity_mode_runs_memalpha_and_its_no_update_arm_from_an_adapter(tiny_model_dir, tmp_path):
    """The parity mode's memalpha arms as real children (TRL's is the same code path as the timing
    run); the verdict and the resuming are tests/test_parity_check.py's."""
    from memalpha.lm.core.policy import LoraSettings, load_policy

    policy, _ = load_policy(
        tiny_model_dir, lora=LoraSettings(r=2, alpha=4, dropout=0.0, target_modules="all-linear")
    )
    policy.save_pretrained(str(tmp_path / "adapter"))
    out = tmp_path / "parity.json"
    args = [
        "--model", tiny_model_dir, *TINY[:-2], "--repeats", "1", "--parity",
        "--arms", "memalpha,memalpha-lr0", "--job", "memory", "--adapter-path", str(tmp_path / "adapter"),
        "--kl-coef", "0.04", "--seed", "3", "--window", "1", "--runs-dir", str(tmp_path / "runs"),
        "--out", str(out),
    ]
    done = run_script(SCRIPT, *args)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    memalpha, lr0 = report["runs"]["memalpha"][0], report["runs"]["memalpha-lr0"][0]
    assert memalpha["seed"] == lr0["seed"] == 3
    assert memalpha["learning_rate"] == 1e-5 and lr0["learning_rate"] == 0.0
    assert memalpha["steps"][0]["kl"] == 0.0  # the reference is the starting adapter
    assert sorted(p.name.split("_")[0] for p in (tmp_path / "runs").glob("*.json")) == [
        "memalpha",
        "memalpha-lr0",
    ]
    learning = report["learning"]
    assert not learning["adequate"] and not learning["passes"] and learning["discriminates"] is None
    assert out.with_suffix(".png").stat().st_size > 0
