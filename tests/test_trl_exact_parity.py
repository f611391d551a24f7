"""memalpha's GRPO update equals TRL's ``GRPOTrainer`` on one identical batch
(experiments/lab/memalpha_lab/trl_exact.py).

Per setting (every loss aggregation TRL shares with memalpha, KL off and on): memalpha's
per-token log-probs, loss and LoRA gradient against TRL's, end to end and on the same float64
log-probs, within ``trl_exact.TOLERANCES``. The check can fail: a TRL side with another clip
range or KL coefficient fails it. Where the two differ by design (the KL clamp, ``bnpo``'s
per-micro-batch normaliser, the position numbering of left-padded rows, the advantages' std) the
difference is shown, not hidden. One tiny float64 Llama (the embedded tokenizer), built once.
"""

from __future__ import annotations

import math

import pytest
import torch

from memalpha_lab import trl_exact as exact
from memalpha_lab.trl_exact import DEFAULT_SETTINGS, TOLERANCES, ExactSetting


@pytest.fixture(scope="module")
def rig(tmp_path_factory, tokenizer):
    """The shared model, memalpha's policy, the adapter TRL loads and the batch."""
    return exact.build_rig(tmp_path_factory.mktemp("trl-exact"), tokenizer=tokenizer)


@pytest.fixture(scope="module")
def rows(rig):
    """Every default setting's comparison row, by setting name."""
    return {setting.name: rig.compare(setting) for setting in DEFAULT_SETTINGS}


def test_settings_cover_two_aggregations_with_kl_off_and_on():
    aggregations = {s.loss_agg for s in DEFAULT_SETTINGS}
    assert len(aggregations) >= 2
    for agg in aggregations:
        assert {s.kl_coef > 0 for s in DEFAULT_SETTINGS if s.loss_agg == agg} == {False, True}


@pytest.mark.parametrize("setting", DEFAULT_SETTINGS, ids=lambda s: s.name)
def test_memalpha_matches_trl_within_tolerance(rows, setting):
    row = rows[setting.name]
    assert row["passed"], {key: row[key] for key in row if "diff" in key or "vs" in key}
    # on the same log-probs the two losses are the same float64 numbers, not merely close
    assert row["same_logps_loss_abs_diff"] <= TOLERANCES["same_logps_loss_abs"]
    assert row["same_logps_grad_max_abs_diff"] <= TOLERANCES["same_logps_grad_max_abs"]
    assert row["grad_norm_memalpha"] > 0 and math.isclose(row["grad_norm_memalpha"], row["grad_norm_trl"],
                                                          rel_tol=1e-5)


def test_the_batch_exercises_clipping_kl_and_the_aggregations(rig, rows):
    """Matching numbers only mean something if every term acts: ratios outside the clip range
    both ways, a KL term that moves the loss, aggregations that give different losses."""
    logps = rig.memalpha_logps()
    old = exact.padded(rig.batch.old_logps, logps.shape[1])
    mask = exact.response_mask(rig.batch.responses, logps.shape[1]).bool()
    ratio = torch.exp(logps - old)[mask]
    assert (ratio < 1 - rig.spec.clip_low).any() and (ratio > 1 + rig.spec.clip_high).any()
    losses = {(s.loss_agg, s.kl_coef): rows[s.name]["loss_memalpha"] for s in DEFAULT_SETTINGS}
    for agg in exact.TRL_LOSS_TYPE:
        assert abs(losses[(agg, 0.1)] - losses[(agg, 0.0)]) > 1e-4
    off = [losses[(agg, 0.0)] for agg in exact.TRL_LOSS_TYPE]
    assert min(abs(a - b) for i, a in enumerate(off) for b in off[i + 1:]) > 1e-4


def test_the_check_fails_when_trl_clips_differently(rig):
    row = rig.compare(ExactSetting("token-mean", 0.1), epsilon_high=rig.spec.clip_low)
    assert not row["passed"]
    assert not row["within_tolerance"]["same_logps_loss_abs"] and not row["within_tolerance"]["loss_abs"]


def test_the_check_fails_when_trl_weighs_the_kl_differently(rig):
    row = rig.compare(ExactSetting("seq-mean-token-mean", 0.1), beta=0.05)
    assert not row["passed"]
    failed = [key for key, ok in row["within_tolerance"].items() if not ok]
    assert {"same_logps_loss_abs", "grad_max_abs_rel"} <= set(failed)


def test_memalpha_clamps_the_k3_term_trl_does_not(rig):
    """memalpha caps a token's k3 KL at 10 (its log-ratio at ±20); TRL does not. A reference
    6 nats above the policy on one token gives k3 = e^6 - 7 ~ 396 in TRL and 10 in memalpha; the
    token-mean losses differ by exactly beta * (396.4 - 10) / tokens, and nothing else differs."""
    setting = ExactSetting("token-mean", 0.1)
    logps = rig.memalpha_logps()
    batch = exact.ExactBatch(**{**vars(rig.batch), "ref_logps": [r.clone() for r in rig.batch.ref_logps]})
    batch.ref_logps[0][0] = logps[0, 0] + 6.0
    loss_m, _ = exact.same_logps_memalpha(logps, batch, setting, rig.spec)
    loss_t, _ = exact.same_logps_trl(rig.trainer(setting), logps, batch, setting, rig.spec)
    k3 = math.exp(6.0) - 6.0 - 1.0
    expected = setting.kl_coef * (k3 - 10.0) / sum(rig.spec.response_lengths)
    assert loss_t - loss_m == pytest.approx(expected, rel=1e-12, abs=1e-12)


def test_bnpo_is_not_token_mean_unless_one_micro_batch(rig):
    """TRL's ``bnpo`` divides each micro-batch by its own token count, memalpha's ``token-mean``
    (and TRL's ``dapo``) by the mini-batch's: they agree only when the micro-batches' counts do
    (here 7 + 3 and 8 + 5 tokens), e.g. with one micro-batch."""
    setting = ExactSetting("token-mean", 0.0)
    logps = rig.memalpha_logps()
    loss_m, _ = exact.same_logps_memalpha(logps, rig.batch, setting, rig.spec)
    trainer = rig.trainer(setting, loss_type="bnpo")
    loss_t, _ = exact.same_logps_trl(trainer, logps, rig.batch, setting, rig.spec)
    assert abs(loss_m - loss_t) > 1e-4
    whole = exact.with_spec(rig.spec, micro_batch_size=len(rig.spec.response_lengths))
    loss_m, _ = exact.same_logps_memalpha(logps, rig.batch, setting, whole)
    trainer = rig.trainer(setting, whole, loss_type="bnpo")
    loss_t, _ = exact.same_logps_trl(trainer, logps, rig.batch, setting, whole)
    assert abs(loss_m - loss_t) <= TOLERANCES["same_logps_loss_abs"]


def test_left_padded_rows_are_numbered_differently(rig):
    """TRL's training forward passes no position ids, so a left-padded row is numbered from its
    first pad column; memalpha (and ``generate``) number from the first real token. Under RoPE
    only the offsets matter, so in exact arithmetic the scores agree; the rotary tables are
    float32, so the padded rows' log-probs move at float32 rounding and the unpadded rows not at all."""
    trainer = rig.trainer(ExactSetting("token-mean", 0.0))
    generation = exact.reference_logps(trainer, rig.batch, rig.spec.temperature)
    trl_numbering = exact.reference_logps(trainer, rig.batch, rig.spec.temperature, positions="trl")
    padded_rows = [len(p) < max(len(q) for q in rig.batch.prompts) for p in rig.batch.prompts]
    assert any(padded_rows) and not all(padded_rows)
    for row, is_padded in enumerate(padded_rows):
        gap = float((generation[row] - trl_numbering[row]).abs().max())
        assert (1e-12 < gap < TOLERANCES["logprob_max_abs"]) if is_padded else gap <= 1e-12
    assert float((rig.memalpha_logps() - generation).abs().max()) <= TOLERANCES["logprob_memalpha_vs_fp64"]


def test_trl_advantages_use_the_bessel_std_memalpha_the_population_std():
    """Not compared above (the advantages are an input, the same on both sides): TRL divides a
    group's centred rewards by ``nanstd`` (Bessel-corrected) + 1e-4, memalpha by the population
    std + 1e-6; for a group of 2 TRL's advantages are 1/sqrt(2) of memalpha's (up to the epsilons)."""
    from trl.trainer.utils import nanstd

    from memalpha.grpo.advantages import group_advantages

    rewards = torch.tensor([0.0, 1.0], dtype=torch.float64)
    assert float(nanstd(rewards)) == pytest.approx(float(rewards.std(correction=1)))
    ours = group_advantages(rewards, [0, 0])
    assert ours.tolist() == pytest.approx([-0.5 / (0.5 + 1e-6), 0.5 / (0.5 + 1e-6)])
    assert float(nanstd(rewards)) / float(rewards.std(correction=0)) == pytest.approx(math.sqrt(2))


def test_bench_exact_mode_writes_its_report_and_fails_on_a_failed_setting(tmp_path, capsys):
    """``bench_vs_trl.py --exact`` (:func:`trl_exact.check`) prints the rows, writes the report and
    exits 1 when a setting fails (the comparison itself a stored row: the real one runs in the
    tests above)."""
    import json

    row = {"setting": "token-mean/dapo, kl 0", "logprob_max_abs_diff": 1e-6, "logprob_memalpha_vs_fp64": 0.0,
           "logprob_trl_vs_fp64_own_positions": 1e-6, "loss_memalpha": 0.1, "loss_abs_diff": 1e-8,
           "grad_norm_memalpha": 2.0, "grad_max_abs_rel": 1e-6, "same_logps_loss_abs_diff": 0.0,
           "same_logps_grad_max_abs_diff": 0.0, "passed": True}
    report = {"settings": [row], "tolerances": dict(TOLERANCES), "passed": True}
    out = tmp_path / "exact.json"
    assert exact.check(out, {"command": "x"}, compare=lambda: json.loads(json.dumps(report)))["passed"]
    written = json.loads(out.read_text())
    assert written["settings"][0]["setting"] == row["setting"] and "machine" in written
    assert written["command"] == "x" and "same-logp" in written["notes"]
    printed = capsys.readouterr().out
    assert row["setting"] in printed and "all settings within tolerance" in printed
    assert f"wrote {out}" in printed
    failed = {**report, "passed": False, "settings": [{**row, "passed": False}]}
    with pytest.raises(SystemExit) as stopped:
        exact.check(out, {}, compare=lambda: json.loads(json.dumps(failed)))
    assert stopped.value.code == 1
    assert json.loads(out.read_text())["passed"] is False  # written before it exits
    assert "SOME SETTINGS OUTSIDE TOLERANCE" in capsys.readouterr().out
