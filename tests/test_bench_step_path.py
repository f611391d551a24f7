"""The benchmarks time the product's step, not a copy of it (issue 40, item 1).

Each benchmark's smallest mode runs with spies on the functions of :mod:`memalpha.train.step` it
must reach (the reference weights of ``update.kl_reference``, the accumulated GRPO gradients, the
optimiser step) and on the one sampler that honours ``rollout.backend``; and no script under
``experiments/`` calls the loss or assembles a round by hand.
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path

import pytest
from conftest import build_tiny_model_dir

from memalpha.lm.core.reference import reference_weights
from memalpha.lm.sampling import generation
from memalpha.train import step

EXPERIMENTS = Path(__file__).resolve().parent.parent / "experiments" / "bench"
sys.path.insert(0, str(EXPERIMENTS))


@pytest.fixture
def spied(monkeypatch):
    """Counts of the step's calls, and each policy ``generate`` call's backend and folding."""
    calls: Counter = Counter()
    sampled: list[tuple[str, bool, str]] = []

    def spy(name, real):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)
        return wrapper

    for name in ("reference_weights", "accumulate_grpo_gradients", "optimizer_step", "response_logprobs"):
        monkeypatch.setattr(step, name, spy(name, getattr(step, name)))
    real_generate = generation.generate

    def generate(*args, **kwargs):
        sampled.append((kwargs.get("backend", "auto"), kwargs.get("fold_adapters", False),
                        kwargs.get("announce_as", "sampling")))
        return real_generate(*args, **kwargs)

    monkeypatch.setattr(generation, "generate", generate)
    return calls, sampled


def test_bench_rollout_takes_the_modules_step_with_its_reference_and_backend(tmp_path, tokenizer, spied):
    import bench_rollout

    calls, sampled = spied
    model_dir = build_tiny_model_dir(tmp_path / "tiny", tokenizer, hidden=32, layers=2, seed=1)
    report = bench_rollout.main(["--smoke", "--model", model_dir, "--backend", "growing-cache",
                                 "--out", str(tmp_path / "bench.json")])
    assert report["settings"]["backend"] == "growing-cache"
    # the reference comes from reference_weights (update.kl_reference), not a bare disable_adapter()
    assert calls["reference_weights"] == 1 and calls["accumulate_grpo_gradients"] == 1
    assert calls["optimizer_step"] == 1
    policy = {(backend, fold) for backend, fold, who in sampled if who == "sampling"}
    reader = {(backend, fold) for backend, fold, who in sampled if who == "reader"}
    assert policy == {("growing-cache", False)} and reader == {("growing-cache", False)}


def test_bench_rollout_reference_is_the_starting_adapter_under_kl_reference_start(
    tmp_path, tokenizer, monkeypatch
):
    """With ``kl_reference: start`` and a starting adapter the reference pass runs with that
    adapter loaded as the frozen reference (not the base that disable_adapter() would give)."""
    import bench_rollout

    seen: list[bool] = []

    def recording(policy):
        from memalpha.lm.core.reference import has_reference_adapter

        seen.append(has_reference_adapter(policy))
        return reference_weights(policy)

    monkeypatch.setattr(step, "reference_weights", recording)
    model_dir = build_tiny_model_dir(tmp_path / "tiny", tokenizer, hidden=32, layers=2, seed=1)
    shape = {"max_new_tokens": 4, "max_prompt_tokens": 1536, "reader_max_new_tokens": 4,
             "micro_batch_size": 2, "learning_rate": 1e-5, "seed": 0}
    module = bench_rollout.build_module(model_dir, **shape)
    from memalpha.lm.core.adapters import export_adapter

    adapter = export_adapter(module.policy, module.tokenizer, tmp_path / "start")
    started = bench_rollout.build_module(model_dir, **shape, adapter_path=str(adapter), kl_reference="start")
    assert started.update_settings.kl_reference == "start"
    from memalpha.data.synthetic import generate_synthetic
    from memalpha.grpo.update import build_optimizer

    pool = generate_synthetic(1, split="train", seed=0, num_chunks=1, facts_per_chunk=2,
                              questions_per_instance=1, chunk_words=20)
    optimizer, _ = build_optimizer([p for p in started.policy.parameters() if p.requires_grad],
                                   started.optimizer_settings)
    bench_rollout.bench_step(started, pool, 2, optimizer, seed=0)
    assert seen == [True]


def test_bench_scale_and_profile_and_update_go_through_the_step(tmp_path, tiny_model_dir, tokenizer, spied):
    import bench_scale
    import bench_update
    import profile_grpo_step

    calls, sampled = spied
    bench_scale.main(["--smoke", "--backend", "growing-cache", "--out", str(tmp_path / "scale.json")])
    assert calls["reference_weights"] == 1 and calls["accumulate_grpo_gradients"] == 1
    assert calls["optimizer_step"] == 1 and [s[:2] for s in sampled] == [("growing-cache", False)]

    calls.clear()
    profile_grpo_step.main(["--model", tiny_model_dir, "--out", str(tmp_path / "profile.json")])
    assert calls["reference_weights"] == 2 and calls["accumulate_grpo_gradients"] == 2  # warm-up + profiled
    assert calls["optimizer_step"] == 2

    calls.clear()
    model_dir = build_tiny_model_dir(tmp_path / "tiny", tokenizer, hidden=32, layers=2, seed=1)
    bench_update.main(["--model", model_dir, "--max-new-tokens", "4", "--repeats", "1",
                       "--out", str(tmp_path / "update.json")])
    assert calls["accumulate_grpo_gradients"] == len(bench_update.PATHS)


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
