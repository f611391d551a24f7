"""GRPO math against hand-computed numbers, and the end-to-end sign test on a tiny policy."""

from __future__ import annotations

import math

import pytest
import torch

from memalpha.grpo.advantages import advantage_shares, group_advantages
from memalpha.grpo.loss import LossOutput, k3_kl, policy_loss

# ---------------------------------------------------------------- group_advantages
# rewards of three groups: a = (1, 0, 0.5), b = (2, 2) (no spread), c = (7) (single member)
REWARDS = torch.tensor([1.0, 0.0, 0.5, 2.0, 2.0, 7.0])
GROUPS = ["a", "a", "a", "b", "b", "c"]


def test_group_scale_by_hand():
    # group a: mean 0.5, deviations (0.5, -0.5, 0), population variance (0.25 + 0.25) / 3 = 1/6
    std_a = math.sqrt(1 / 6)
    expected = torch.tensor([0.5 / std_a, -0.5 / std_a, 0.0, 0.0, 0.0, 0.0])
    got = group_advantages(REWARDS, GROUPS, scale="group")
    assert torch.allclose(got, expected, atol=1e-5)
    assert got[3:].eq(0).all()  # zero spread and single member: exactly 0


def test_advantage_shares_by_hand():
    # one group: r1 = (1, 0, 1, 0), r2 = (1, 1, 0, 1); v = r1 + r2 = (2, 1, 1, 1), centred
    # (.75, -.25, -.25, -.25), sum of squares .75; r1 centred (.5, -.5, .5, -.5) gives .5 with v,
    # r2 centred (.25, .25, -.75, .25) gives .25: shares 2/3 and 1/3
    r1, r2 = torch.tensor([1.0, 0, 1, 0]), torch.tensor([1.0, 1, 0, 1])
    shares = advantage_shares(r1 + r2, [0] * 4, {"r1": r1, "r2": r2})
    assert shares == pytest.approx({"r1": 2 / 3, "r2": 1 / 3}, abs=1e-12)
    # a term that falls where the other rises is pushed against: r2 = (0, 1, 0, 1) against r1 = (3, 0, 3, 0)
    r1, r2 = torch.tensor([3.0, 0, 3, 0]), torch.tensor([0.0, 1, 0, 1])
    shares = advantage_shares(r1 + r2, [0] * 4, {"r1": r1, "r2": r2})
    assert shares["r2"] == pytest.approx(-0.5) and shares["r1"] == pytest.approx(1.5)


def test_advantage_shares_weigh_groups_as_the_update_does():
    # group a: v = (1, 0) from r2 alone, std .5, weight 2; group b: v = (4, 0) from r1 alone, std 2,
    # weight .5; flat group c adds nothing. Sum c (v - mean)^2: a 2 * (.25 + .25) = 1, b .5 * (4 + 4) = 4
    values = torch.tensor([1.0, 0, 4, 0, 5, 5])
    r2 = torch.tensor([1.0, 0, 0, 0, 5, 5])
    shares = advantage_shares(values, list("aabbcc"), {"r1": values - r2, "r2": r2})
    assert shares == pytest.approx({"r1": 0.8, "r2": 0.2}, abs=1e-12)
    assert advantage_shares(torch.tensor([5.0, 5.0]), ["c", "c"], {"r1": torch.tensor([5.0, 5.0])}) == {}


def test_batch_scale_by_hand():
    # batch mean 12.5 / 6; squared deviations sum to 32.208333..., population std sqrt(32.208333 / 6)
    mean = 12.5 / 6
    var = sum((r - mean) ** 2 for r in [1.0, 0.0, 0.5, 2.0, 2.0, 7.0]) / 6
    assert var == pytest.approx(5.3680556, abs=1e-6)
    std = math.sqrt(var)
    expected = torch.tensor([0.5 / std, -0.5 / std, 0.0, 0.0, 0.0, 0.0])
    assert torch.allclose(group_advantages(REWARDS, GROUPS, scale="batch"), expected, atol=1e-6)


def test_none_scale_is_mean_centred_only():
    expected = torch.tensor([0.5, -0.5, 0.0, 0.0, 0.0, 0.0])
    assert torch.equal(group_advantages(REWARDS, GROUPS, scale="none"), expected)


def test_group_ids_as_tensor_and_interleaved():
    rewards = torch.tensor([3.0, 10.0, 1.0, 10.0])
    ids = torch.tensor([7, 9, 7, 9])  # group 7: (3, 1) -> mean 2, std 1; group 9 flat
    got = group_advantages(rewards, ids, eps=0.0)
    assert torch.equal(got, torch.tensor([1.0, 0.0, -1.0, 0.0]))


def test_group_advantages_rejects_bad_input():
    with pytest.raises(ValueError, match="group_ids has 2 entries"):
        group_advantages(torch.tensor([1.0, 2.0, 3.0]), [0, 1])
    with pytest.raises(ValueError, match="not finite"):
        group_advantages(torch.tensor([1.0, float("nan")]), [0, 0])
    with pytest.raises(ValueError, match="scale"):
        group_advantages(REWARDS, GROUPS, scale="std")


# ---------------------------------------------------------------- policy_loss
# two sequences, three columns; row 1's last column is padding (its ratio 2.0 must be ignored)
OLD = torch.tensor([[-1.0, -1.0, -1.0], [-2.0, -2.0, -2.0]])
RATIOS = torch.tensor([[1.5, 0.7, 1.0], [1.1, 0.5, 2.0]])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])
ADV = torch.tensor([1.0, -2.0])
# by hand, clip 0.2:
#   row 0 (A=+1): r=1.5 -> min(1.5, 1.2) = 1.2 (clipped high) -> -1.2;
#                 r=0.7 -> min(0.7, 0.8) = 0.7 -> -0.7; r=1 -> -1
#   row 1 (A=-2): r=1.1 -> min(-2.2, -2.2) -> 2.2; r=0.5 -> min(-1.0, -1.6) = -1.6 (clipped low) -> 1.6
#   sum = -2.9 + 3.8 = 0.9 over 5 tokens
PG_SUM, TOKENS = 0.9, 5


def _logps():
    return (OLD + RATIOS.log()).clone().requires_grad_(True)


def test_token_mean_with_clipping_both_sides():
    logps = _logps()
    out = policy_loss(logps, OLD, None, ADV, MASK)
    assert isinstance(out, LossOutput) and out.finite
    assert out.loss.item() == pytest.approx(PG_SUM / TOKENS, abs=1e-6)
    assert out.metrics["clip_ratio/high"] == pytest.approx(1 / 5)
    assert out.metrics["clip_ratio/low"] == pytest.approx(1 / 5)
    assert out.metrics["clip_ratio"] == pytest.approx(2 / 5)
    assert out.metrics["ratio_mean"] == pytest.approx((1.5 + 0.7 + 1.0 + 1.1 + 0.5) / 5, abs=1e-6)
    assert out.metrics["tokens"] == 5
    out.loss.backward()
    # d/dlogp = -A * ratio / N where unclipped, 0 where the clip is active, 0 on padding
    expected = torch.tensor([[0.0, -0.7 / 5, -1.0 / 5], [2.0 * 1.1 / 5, 0.0, 0.0]])
    assert torch.allclose(logps.grad, expected, atol=1e-6)


def test_asymmetric_clip_high():
    # clip_high 0.6: row 0 token 0 (ratio 1.5) is no longer clipped: -1.5 instead of -1.2
    out = policy_loss(_logps(), OLD, None, ADV, MASK, clip_low=0.2, clip_high=0.6)
    assert out.loss.item() == pytest.approx((PG_SUM - 0.3) / TOKENS, abs=1e-6)
    assert out.metrics["clip_ratio/high"] == 0.0


def test_seq_mean_token_mean():
    out = policy_loss(_logps(), OLD, None, ADV, MASK, agg="seq-mean-token-mean")
    assert out.loss.item() == pytest.approx(((-2.9 / 3) + (3.8 / 2)) / 2, abs=1e-6)


def test_seq_mean_token_sum_norm():
    out = policy_loss(_logps(), OLD, None, ADV, MASK, agg="seq-mean-token-sum-norm", max_len=4)
    assert out.loss.item() == pytest.approx(((-2.9 / 4) + (3.8 / 4)) / 2, abs=1e-6)
    with pytest.raises(ValueError, match="max_len"):
        policy_loss(_logps(), OLD, None, ADV, MASK, agg="seq-mean-token-sum-norm")


def test_k3_kl_by_hand_with_clamps():
    # d = ref - logp: 0 -> 0; ln2 -> 2 - ln2 - 1; -ln2 -> 0.5 + ln2 - 1; ln3 -> 3 - ln3 - 1;
    # 25 -> clamp 20 -> cap 10
    logps = _logps()
    d = torch.tensor([[0.0, math.log(2), -math.log(2)], [math.log(3), 25.0, 123.0]])
    ref = logps.detach() + d
    per_token = torch.tensor([[0.0, 1 - math.log(2), math.log(2) - 0.5], [2 - math.log(3), 10.0, 10.0]])
    assert torch.allclose(k3_kl(logps.detach(), ref), per_token, atol=1e-6)
    kl_sum = float(per_token[0].sum() + per_token[1, :2].sum())
    out = policy_loss(logps, OLD, ref, ADV, MASK, kl_coef=0.1)
    assert out.metrics["kl"] == pytest.approx(kl_sum / 5, abs=1e-5)
    assert out.loss.item() == pytest.approx((PG_SUM + 0.1 * kl_sum) / 5, abs=1e-5)
    out.loss.backward()
    # KL gradient 1 - e^d per token (0 where clamped), times 0.1 / 5, on top of the policy-gradient part
    kl_grad = torch.tensor([[0.0, 1 - 2.0, 1 - 0.5], [1 - 3.0, 0.0, 0.0]]) * 0.1 / 5
    pg_grad = torch.tensor([[0.0, -0.7 / 5, -1.0 / 5], [2.0 * 1.1 / 5, 0.0, 0.0]])
    assert torch.allclose(logps.grad, pg_grad + kl_grad, atol=1e-6)


def test_kl_needs_reference():
    with pytest.raises(ValueError, match="ref_logps"):
        policy_loss(_logps(), OLD, None, ADV, MASK, kl_coef=0.1)


def test_global_normaliser_makes_micro_batches_add_up():
    for agg, normaliser in (
        ("token-mean", 5.0),
        ("seq-mean-token-mean", 2.0),
        ("seq-mean-token-sum-norm", 2.0),
    ):
        full = policy_loss(_logps(), OLD, None, ADV, MASK, agg=agg, max_len=4).loss
        parts = sum(
            policy_loss(_logps()[i : i + 1], OLD[i : i + 1], None, ADV[i : i + 1], MASK[i : i + 1], agg=agg,
                        max_len=4, token_normaliser=normaliser).loss
            for i in range(2)
        )
        assert parts.item() == pytest.approx(full.item(), abs=1e-6), agg
    # without the global count, per-micro-batch means do not add up to the batch mean
    local = sum(policy_loss(_logps()[i : i + 1], OLD[i : i + 1], None, ADV[i : i + 1], MASK[i : i + 1]).loss
                for i in range(2))
    assert local.item() != pytest.approx(PG_SUM / TOKENS, abs=1e-3)


def test_one_epoch_without_old_logps_is_the_policy_gradient():
    logps = _logps()
    out = policy_loss(logps, None, None, ADV, MASK)
    assert out.metrics["ratio_mean"] == 1.0
    assert out.loss.item() == pytest.approx(-(3 * 1.0 + 2 * -2.0) / 5, abs=1e-6)
    out.loss.backward()
    assert torch.allclose(logps.grad, torch.tensor([[-0.2, -0.2, -0.2], [0.4, 0.4, 0.0]]), atol=1e-6)


def test_padding_values_never_leak_and_nan_is_flagged():
    logps = _logps().detach()
    logps[1, 2] = float("nan")  # padding column: ignored
    out = policy_loss(logps.requires_grad_(True), OLD, OLD, ADV, MASK, kl_coef=0.1)
    assert out.finite
    out.loss.backward()
    assert torch.isfinite(logps.grad).all()
    poisoned = _logps().detach()
    poisoned[0, 1] = float("nan")  # a real token: the loss is NaN and flagged, not zeroed
    bad = policy_loss(poisoned, OLD, None, ADV, MASK)
    assert not bad.finite and math.isnan(bad.loss.item())
    huge = _logps().detach()
    huge[1, 0] = 200.0  # ratio overflows to inf with a negative advantage -> infinite loss
    assert not policy_loss(huge, OLD, None, ADV, MASK).finite


def test_entropy_metric_is_a_masked_mean():
    entropy = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 100.0]])
    out = policy_loss(_logps(), OLD, None, ADV, MASK, entropy=entropy)
    assert out.metrics["entropy"] == pytest.approx(3.0)


# ---------------------------------------------------------------- the sign test
from conftest import SMALL_VOCAB_CHOSEN as CHOSEN


def _first_token_probability(model, prompts) -> float:
    with torch.no_grad():
        logp = torch.stack(
            [
                torch.log_softmax(model(input_ids=torch.tensor([p])).logits[0, -1].float(), -1)[CHOSEN]
                for p in prompts
            ]
        )
    return float(logp.exp().mean())


def _grpo_run(model_dir, tokenizer, reward_sign: int, steps: int = 5) -> tuple[float, float]:
    from memalpha.lm.core.policy import LoraSettings, load_policy
    from memalpha.lm.core.prompt_sharing import response_mask
    from memalpha.lm.logprobs.per_token import token_logprobs
    from memalpha.lm.logprobs.spec import LogprobSpec
    from memalpha.lm.sampling.generation import generate

    torch.manual_seed(0)
    model, _ = load_policy(model_dir, lora=LoraSettings(r=4, alpha=8))
    optimiser = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=0.01)
    prompts = [[1, 3, 4], [6, 7]]
    group = 16
    before = _first_token_probability(model, prompts)
    for step in range(steps):
        batch_prompts = [p for p in prompts for _ in range(group)]
        out = generate(model, tokenizer, batch_prompts, max_new_tokens=2, seed=100 + step)
        hits = torch.tensor([float(r[0] == CHOSEN) for r in out.response_ids])
        rewards = hits if reward_sign > 0 else 1.0 - hits
        advantages = group_advantages(rewards, [i // group for i in range(len(batch_prompts))])
        with torch.no_grad():
            old = token_logprobs(model, out.prompt_ids, out.response_ids, LogprobSpec(micro_batch_size=16))
        for _epoch in range(2):  # a second epoch makes the ratio differ from 1
            logps = token_logprobs(model, out.prompt_ids, out.response_ids, LogprobSpec(micro_batch_size=16))
            loss = policy_loss(logps, old, None, advantages, response_mask(out.response_ids, logps.shape[1]))
            assert loss.finite
            optimiser.zero_grad()
            loss.loss.backward()
            optimiser.step()
    return before, _first_token_probability(model, prompts)


def test_sign_rewarded_token_becomes_more_likely(small_vocab_model_dir, tokenizer):
    before, after = _grpo_run(small_vocab_model_dir, tokenizer, reward_sign=+1)
    assert after > 2 * before and after > 0.5, (before, after)


def test_sign_penalised_token_becomes_less_likely(small_vocab_model_dir, tokenizer):
    before, after = _grpo_run(small_vocab_model_dir, tokenizer, reward_sign=-1)
    assert after < 0.5 * before, (before, after)


def test_a_kl_coefficient_without_reference_logprobs_is_an_error_not_a_silent_zero():
    """micro_batch_loss passes the setting's coefficient as it is: a batch that lost its reference
    log-probs under kl_coef > 0 stops the update instead of training without the penalty."""
    from memalpha.grpo.batch import GRPOBatch
    from memalpha.grpo.settings import UpdateSettings
    from memalpha.grpo.update import micro_batch_loss

    logps = _logps()
    rows = [logps[i, : int(MASK[i].sum())].detach() for i in range(logps.shape[0])]
    batch = GRPOBatch(prompt_ids=[[1]] * len(rows), response_ids=[[2] * len(r) for r in rows],
                      advantages=ADV, old_logps=rows, ref_logps=None)
    common = {"token_normaliser": float(MASK.sum()), "seq_normaliser": float(len(rows)),
              "max_response_len": logps.shape[1]}
    with pytest.raises(ValueError, match="kl_coef is 0.1 but the batch has no reference log-probs"):
        micro_batch_loss(logps, None, batch, UpdateSettings(kl_coef=0.1), **common)
    out = micro_batch_loss(logps, None, batch, UpdateSettings(kl_coef=0.0), **common)
    assert torch.isfinite(out.loss)


def test_a_rounds_advantage_shares_split_each_reward_into_its_terms():
    from memalpha.agent.reward_settings import RewardSettings
    from memalpha.agent.rollout import RolloutOutput, RolloutRecord, TurnSample
    from memalpha.train.step import reward_term_shares

    weights = RewardSettings()  # w 1, beta 0.05, gamma 0.1
    # two rollouts of one instance, one turn each: r1 (1, 0), r2 (1, 0), r3 (.2, 0), r4 (0, 0)
    rewards = [1 + 1 + 0.05 * 0.2, 0.0]
    samples = [TurnSample(group_id=0, rollout_id=i, chunk_index=0, prompt_ids=[1], response_ids=[2],
                          truncated=False, num_calls=1, num_successful_calls=1 - i, r2=1.0 - i, reward=r)
               for i, r in enumerate(rewards)]
    records = [RolloutRecord("x", "synth", i, [], {}, 0, 10, [], r1=1.0 - i, r3=0.2 * (1 - i))
               for i in range(2)]
    out = RolloutOutput(samples, records, 0.0, 0.0, 0)
    shares = reward_term_shares(out, (torch.tensor(rewards), [0, 0]), weights)
    total = 2.01
    assert shares == pytest.approx({"advantage/share_r1": 1 / total, "advantage/share_r2": 1 / total,
                                    "advantage/share_r3": 0.01 / total, "advantage/share_r4": 0.0}, abs=1e-6)
