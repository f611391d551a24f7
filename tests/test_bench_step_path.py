"""The benchmarks time the product's step, not a copy of it (issue 40, item 1).

Each benchmark's smallest mode runs as a script (one child process for all of them,
``script_probe.py``) with probes on the functions of the step it must reach
(:mod:`memalpha.train.step`'s reference weights of ``update.kl_reference``, :mod:`memalpha.grpo.update`'s
accumulated GRPO gradients and optimiser step) and on the one sampler that honours
``rollout.backend``; and no script under ``experiments/`` calls the loss or assembles a round by hand.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import build_tiny_model_dir
from script_probe import Run, run_probed

from memalpha.lm.core.adapters import export_adapter
from memalpha.lm.core.policy import LoraSettings, load_policy

EXPERIMENTS = Path(__file__).resolve().parent.parent / "experiments" / "bench"


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tokenizer, tiny_model_dir):
    """bench_rollout (from a starting adapter under ``kl_reference: start``), bench_scale,
    profile_grpo_step and bench_update, each in its smallest mode, with the ``step`` probe."""
    tmp = tmp_path_factory.mktemp("step-path")
    model_dir = build_tiny_model_dir(tmp / "tiny", tokenizer, hidden=32, layers=2, seed=1)
    policy, policy_tokenizer = load_policy(model_dir, lora=LoraSettings(r=8, alpha=16, dropout=0.0,
                                                                        target_modules="all-linear"))
    adapter = export_adapter(policy, policy_tokenizer, tmp / "start")
    bench = "experiments/bench"
    done = run_probed(tmp, [
        Run(f"{bench}/bench_rollout.py", ["--smoke", "--model", model_dir, "--backend", "hf-generate",
                                          "--adapter-path", adapter, "--kl-reference", "start",
                                          "--out", tmp / "rollout.json"]),
        Run(f"{bench}/bench_scale.py", ["--smoke", "--backend", "hf-generate",
                                        "--out", tmp / "scale.json"]),
        Run(f"{bench}/profile_grpo_step.py", ["--model", tiny_model_dir, "--out", tmp / "profile.json"]),
        Run(f"{bench}/bench_update.py", ["--model", model_dir, "--max-new-tokens", "4", "--repeats", "1",
                                         "--out", tmp / "update.json"]),
    ], probes=["step"])
    by_script = {Path(run["script"]).stem: run for run in done}
    for name, run in by_script.items():
        assert run["code"] == 0, f"{name} failed:\n{run['stderr'][-3000:]}"
    reports = {"bench_rollout": "rollout", "bench_update": "update"}
    for name, report in reports.items():
        by_script[name]["report"] = json.loads((tmp / f"{report}.json").read_text())
    return by_script


def test_bench_rollout_takes_the_modules_step_with_its_reference_and_backend(runs):
    rollout = runs["bench_rollout"]
    calls, sampled = rollout["calls"], rollout["generate"]
    assert rollout["report"]["settings"]["backend"] == "hf-generate"
    # the reference comes from reference_weights (update.kl_reference), not a bare disable_adapter()
    assert calls["reference_weights"] == 1 and calls["accumulate_grpo_gradients"] == 1
    assert calls["optimizer_step"] == 1
    policy = {backend for backend, who in sampled if who == "sampling"}
    reader = {backend for backend, who in sampled if who == "reader"}
    assert policy == {"hf-generate"} and reader == {"hf-generate"}


def test_bench_rollout_reference_is_the_starting_adapter_under_kl_reference_start(runs):
    """With ``--kl-reference start`` and ``--adapter-path`` the reference pass runs with that
    adapter loaded as the frozen reference (not the base that disable_adapter() would give)."""
    settings = runs["bench_rollout"]["report"]["settings"]
    assert settings["kl_reference"] == "start" and settings["adapter_path"].endswith("start")
    assert runs["bench_rollout"]["reference_adapter"] == [True]


def test_bench_scale_and_profile_and_update_go_through_the_step(runs):
    scale = runs["bench_scale"]
    assert scale["calls"]["reference_weights"] == 1 and scale["calls"]["accumulate_grpo_gradients"] == 1
    assert scale["calls"]["optimizer_step"] == 1
    assert [s[0] for s in scale["generate"]] == ["hf-generate"]

    profile = runs["profile_grpo_step"]["calls"]  # a warm-up step and the profiled one
    assert profile["reference_weights"] == 2 and profile["accumulate_grpo_gradients"] == 2
    assert profile["optimizer_step"] == 2

    update = runs["bench_update"]
    assert len(update["report"]["summary"]) == 4  # padded, packed, streamed, accumulated
    assert update["calls"]["accumulate_grpo_gradients"] == len(update["report"]["summary"])


HAND_BUILT = re.compile(
    r"\b(policy_loss|micro_batch_loss|accumulate_grpo_gradients|cut_minibatches|group_advantages|"
    r"optimizer_step)\(|disable_adapter\(\)"
)


def test_no_benchmark_assembles_the_step_by_hand():
    offenders = {
        path.name: sorted(set(HAND_BUILT.findall(path.read_text(encoding="utf-8"))))
        for path in sorted(EXPERIMENTS.glob("bench*.py")) + [EXPERIMENTS / "profile_grpo_step.py"]
    }
    assert {name: found for name, found in offenders.items() if found} == {}
