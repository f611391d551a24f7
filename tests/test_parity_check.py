"""The parity check of experiments/bench/bench_vs_trl.py --parity (experiments/lab/memalpha_lab/parity.py,
run by experiments/lab/memalpha_lab/vs_trl_parity.py from the options of
experiments/lab/memalpha_lab/vs_trl_options.py): its verdict fails an arm that never learns and passes
equal arms, and its runs resume from their files.

Runs are recorded per-step rewards (no model): the driver gets a ``run_child`` that returns them,
so these tests take about a second; tests/test_bench_vs_trl.py runs the real children. The
committed report is rebuilt by the script itself.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from script_probe import run_script

from memalpha_lab import common as _common
from memalpha_lab import parity as _parity
from memalpha_lab import vs_trl_parity
from memalpha_lab.vs_trl_options import parse_args, settings_from_args

STEPS = 20
# per-step rewards of a learning run: 0.6 rising by 0.04 a step, a small wobble by seed
LEARNS = {seed: [0.6 + 0.04 * i + 0.01 * ((seed + i) % 3 - 1) for i in range(STEPS)] for seed in range(4)}
# a run that never learns: it stays at the start
FLAT = {seed: [0.6 + 0.01 * ((seed + i) % 3 - 1) for i in range(STEPS)] for seed in range(4)}


def _run(rewards):
    return {"steps": [{"reward": r} for r in rewards]}


def test_final_mean_and_the_verdict_fail_an_arm_that_never_learns_and_pass_equal_arms():
    runs = {
        "memalpha": [_run(LEARNS[(s + 1) % 4]) for s in range(4)],  # the same runs in another order
        "trl": [_run(LEARNS[s]) for s in range(4)],
        "memalpha-lr0": [_run(FLAT[s]) for s in range(4)],
    }
    for done in runs.values():
        for seed, run in enumerate(done):
            run["seed"] = seed
    assert _parity.final_mean(runs["trl"][0], 10) == pytest.approx(sum(LEARNS[0][-10:]) / 10)
    learning = _parity.summarise_learning(runs, margin=0.1, steps=STEPS, window=10)
    mem, lr0 = learning["against_trl"]["memalpha"], learning["against_trl"]["memalpha-lr0"]
    assert (
        mem["difference"] == pytest.approx(0.0, abs=1e-12)
        and mem["verdict"] == "equivalent"
        and mem["passes"]
    )
    # the flat arm sits 0.04 * mean(10..19) = 0.58 below
    assert lr0["difference"] == pytest.approx(-0.58, abs=1e-9) and lr0["verdict"] == "different"
    assert learning["adequate"] and learning["passes"] and learning["no_update_fails"] is True
    assert learning["discriminates"] is True
    assert learning["arms"]["memalpha-lr0"]["reward_per_step_mean"][0] == pytest.approx(0.6, abs=0.01)
    lines = "\n".join(_parity.verdict_lines(learning))
    assert (
        "memalpha-lr0 - trl" in lines
        and "different" in lines
        and "the check discriminates (memalpha passes, lr-0 fails): True" in lines
    )


def test_the_verdict_cannot_pass_a_short_or_small_check_or_a_noisy_one():
    runs = {"memalpha": [_run(LEARNS[s]) for s in range(4)], "trl": [_run(LEARNS[s]) for s in range(4)]}
    short = _parity.summarise_learning(runs, margin=0.1, steps=5, window=2)
    assert (
        not short["adequate"]
        and not short["passes"]
        and short["against_trl"]["memalpha"]["verdict"] == "equivalent"
    )
    few = _parity.summarise_learning({arm: done[:3] for arm, done in runs.items()}, 0.1, STEPS, 10)
    assert not few["passes"] and "memalpha: 3 runs < 4" in few["problems"][0]
    # runs whose final means spread by ±0.3: the interval is wider than the margin
    noisy = {"memalpha": [_run([v] * STEPS) for v in (0.5, 1.1, 0.8, 0.8)],
             "trl": [_run([v] * STEPS) for v in (0.6, 1.0, 0.9, 0.7)]}
    verdict = _parity.summarise_learning(noisy, 0.1, STEPS, 10)
    assert verdict["against_trl"]["memalpha"]["verdict"] == "inconclusive" and not verdict["passes"]
    assert verdict["discriminates"] is None and verdict["no_update_fails"] is None  # no lr-0 arm
    # an lr-0 arm equal to TRL passes too: the check does not discriminate
    noisy["memalpha-lr0"] = noisy["trl"]
    same = _parity.summarise_learning(noisy, 0.5, STEPS, 10)
    assert same["passes"] and same["no_update_fails"] is False and same["discriminates"] is False


def test_the_settings_digest_ignores_the_seed_and_sees_the_adapter(tmp_path):
    base = {"steps": 20, "seed": 0, "adapter_path": ""}
    assert _parity.settings_digest(base) == _parity.settings_digest({**base, "seed": 3})
    assert _parity.settings_digest(base) != _parity.settings_digest({**base, "steps": 21})
    (tmp_path / "adapter_model.safetensors").write_bytes(b"one")
    with_adapter = {**base, "adapter_path": str(tmp_path)}
    first = _parity.settings_digest(with_adapter)
    (tmp_path / "adapter_model.safetensors").write_bytes(b"two")
    assert _parity.settings_digest(with_adapter) != first
    assert _parity.plan(["a", "b"], [0, 1]) == [(0, "a"), (0, "b"), (1, "a"), (1, "b")]


def _fake_child(calls):
    def run_child(arm, settings, timeout_s):
        calls.append((arm, settings.seed))
        rewards = FLAT[settings.seed] if arm == "memalpha-lr0" else LEARNS[settings.seed]
        steps = [
            {
                "reward": r,
                "step_s": 2.0 if arm == "trl" else 1.0,
                "gen_s": 0.5,
                "generated_tokens": 10,
                "kl": 0.0,
            }
            for r in rewards
        ]
        return {"steps": steps, "setup_s": 1.0, "peak_rss_mib": 100.0, "rss_after_import_mib": 50.0}

    return run_child


def _parity_check(argv, run_child):
    """What ``bench_vs_trl.py ARGV`` does in its parity mode, with ``run_child`` for the children."""
    args = parse_args(argv)
    assert args.parity
    return vs_trl_parity.run(args, settings_from_args(args), {}, run_child)


def test_parity_runs_resume_from_their_files_and_the_summary_waits_for_all(tmp_path, monkeypatch, capsys):
    calls = []
    child = _fake_child(calls)
    monkeypatch.setattr(_common, "machine_info", dict)  # torch and transformers versions: seconds of imports
    runs_dir, out = tmp_path / "runs", tmp_path / "parity.json"
    args = ["--parity", "--steps", str(STEPS), "--repeats", "4", "--seed", "0", "--runs-dir", str(runs_dir),
            "--out", str(out)]
    # a first invocation that planned two seeds (as if stopped after them): a report, but no parity check
    plots = []
    monkeypatch.setattr(_parity, "plot", lambda *a: plots.append(a))
    report = _parity_check([*args[:4], "2", *args[5:]], child)
    assert report is not None and not report["learning"]["adequate"]  # 2 runs a side: reported, never a pass
    assert not report["learning"]["passes"]
    assert calls == [(arm, seed) for seed in (0, 1) for arm in _parity.ARMS]
    assert len(list(runs_dir.glob("*.json"))) == 6
    out.unlink()
    # --summary-only with runs missing: nothing runs, no report
    assert _parity_check([*args, "--summary-only"], child) is None and len(calls) == 6
    assert "6 of 12 runs missing" in capsys.readouterr().err
    assert len(plots) == 1 and not out.exists()
    monkeypatch.undo()
    monkeypatch.setattr(_common, "machine_info", dict)
    # the full invocation runs only seeds 2 and 3, then reports
    report = _parity_check(args, child)
    assert calls[6:] == [(arm, seed) for seed in (2, 3) for arm in _parity.ARMS]
    assert report["seeds"] == [0, 1, 2, 3] and report["learning"]["discriminates"] is True
    assert report["ratio_memalpha_over_trl"]["step_s_median"] == pytest.approx(0.5)
    saved = json.loads(out.read_text())
    assert saved["learning"]["against_trl"]["memalpha-lr0"]["verdict"] == "different"
    assert out.with_suffix(".png").stat().st_size > 0
    run_file = runs_dir / f"{saved['run_ids']['trl'][2]}.json"
    assert json.loads(run_file.read_text())["seed"] == 2 and "trl_seed2_" in run_file.name
    # rebuilt from the files alone, the same verdict
    monkeypatch.setattr(_parity, "plot", lambda *a: None)
    again = _parity_check([*args, "--summary-only"], child)
    assert len(calls) == 12 and again["learning"] == report["learning"]
    assert json.loads(run_file.read_text())["settings"]["seed"] == 2
    # a checkout without the adapter the runs started from names their digest
    digest = saved["settings_digest"]
    named = _parity_check([*args, "--summary-only", "--adapter-path", str(tmp_path / "gone"),
                           "--settings-digest", digest], child)
    assert named["learning"] == report["learning"]
    with pytest.raises(ValueError, match="not a PEFT adapter folder"):
        _parity_check([*args, "--adapter-path", str(tmp_path / "gone"), "--settings-digest", digest], child)


def test_the_committed_parity_report_is_rebuilt_from_its_committed_runs(tmp_path):
    """docs/results.md quotes experiments/results/bench_vs_trl_parity.json: its verdicts must come
    out of the 12 runs stored beside it, by the report's own command, without the adapter."""
    results = Path(__file__).resolve().parent.parent / "experiments" / "results"
    committed = json.loads((results / "bench_vs_trl_parity.json").read_text())
    argv = committed["command"].split()[2:]  # drop the interpreter and the script
    argv[argv.index("--adapter-path") + 1] = str(tmp_path / "no_adapter_here")
    out = tmp_path / "parity.json"
    done = run_script("experiments/bench/bench_vs_trl.py", *argv, "--settings-digest",
                      committed["settings_digest"], "--runs-dir", results / "parity", "--out", out)
    assert done.returncode == 0, done.stderr[-3000:]
    rebuilt = json.loads(out.read_text())
    assert rebuilt["learning"] == committed["learning"]
    assert rebuilt["ratio_memalpha_over_trl"] == pytest.approx(committed["ratio_memalpha_over_trl"])
    against = committed["learning"]["against_trl"]
    assert against["memalpha-lr0"]["verdict"] == "different" and committed["learning"]["no_update_fails"]
    assert "the check discriminates" in done.stdout and out.with_suffix(".png").stat().st_size > 0
