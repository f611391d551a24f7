"""Optimiser steps per rollout round and the dual clip (issue 15, difference 2).

The official run cuts each round into mini-batches of 32 turn samples (verl's
``ppo_mini_batch_size``), so the PPO ratio and its clips act, and bounds the loss of a
negative-advantage token at ``clip_ratio_c * |A|`` (verl's dual clip at 3). memalpha's default
profile keeps one step per round and no dual clip.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
import torch
import yaml
from lightning.pytorch import Callback, Trainer

from memalpha.agent import answer_metrics as scoring
from memalpha.grpo.batch import GRPOBatch, cut_minibatches
from memalpha.grpo.loss import policy_loss
from memalpha.grpo.settings import UpdateSettings
from memalpha.train.profiles import PROFILES

REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------ the cut
@pytest.mark.parametrize(
    ("samples", "size", "steps"),
    [(8, 4, 2), (9, 4, 3), (1, 32, 1), (32, 32, 1), (33, 32, 2), (2500, 32, 79)],
)
def test_a_round_takes_ceil_samples_over_size_steps(samples, size, steps):
    assert UpdateSettings(mini_batch_size=size).mini_batches_per_epoch(samples) == steps


def test_without_a_size_the_count_is_num_mini_batches_capped_by_the_round():
    assert UpdateSettings().mini_batches_per_epoch(100) == 1
    assert UpdateSettings(num_mini_batches=3).mini_batches_per_epoch(100) == 3
    assert UpdateSettings(num_mini_batches=3).mini_batches_per_epoch(2) == 2


def test_old_logps_are_needed_only_when_the_round_gives_several_steps():
    settings = UpdateSettings(mini_batch_size=4)
    assert not settings.needs_old_logps(4)  # one step: the ratio is 1, no old pass
    assert settings.needs_old_logps(5)
    assert not UpdateSettings().needs_old_logps(1000)  # the default profile: one step per round


def _batch(rows: int) -> GRPOBatch:
    return GRPOBatch(
        prompt_ids=[[row] for row in range(rows)],
        response_ids=[[row, row] for row in range(rows)],
        advantages=torch.arange(rows, dtype=torch.float32),
    )


def test_nine_samples_with_size_four_are_spread_over_three_batches_in_order():
    settings = UpdateSettings(mini_batch_size=4)
    parts = cut_minibatches(_batch(9), settings.mini_batches_per_epoch(9), ppo_epochs=1, seed=0)
    assert [batch.prompt_ids for batch in parts] == [[[0], [1], [2]], [[3], [4], [5]], [[6], [7], [8]]]


def test_ten_samples_with_size_four_give_sizes_four_three_three():
    settings = UpdateSettings(mini_batch_size=4)
    parts = cut_minibatches(_batch(10), settings.mini_batches_per_epoch(10), ppo_epochs=1, seed=0)
    assert [len(batch) for batch in parts] == [4, 3, 3]
    assert [row for batch in parts for row in batch.advantages.tolist()] == list(range(10))


# --------------------------------------------------------------- validation
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mini_batch_size": 0}, r"^update\.mini_batch_size must be >= 1"),
        (
            {"mini_batch_size": 4, "num_mini_batches": 2},
            r"^update\.mini_batch_size and update\.num_mini_batches",
        ),
        ({"clip_ratio_c": 1.0}, r"^update\.clip_ratio_c must be > 1"),
        ({"clip_ratio_c": 0.5}, r"^update\.clip_ratio_c must be > 1"),
    ],
)
def test_bad_update_settings_fail_with_one_line_naming_the_option(kwargs, message):
    with pytest.raises(ValueError, match=message) as error:
        UpdateSettings(**kwargs)
    assert "\n" not in str(error.value)


def test_the_profiles_differ_only_where_the_official_run_does():
    default = UpdateSettings()
    assert default.mini_batch_size is None and default.num_mini_batches == 1 and default.clip_ratio_c is None
    assert PROFILES["official"]["model.update.mini_batch_size"] == 32
    assert PROFILES["official"]["model.update.clip_ratio_c"] == 3.0
    UpdateSettings(mini_batch_size=32, clip_ratio_c=3.0)  # the official values are valid together


# ---------------------------------------------------------------- dual clip
def _loss(ratio: float, advantage: float, clip_ratio_c: float | None):
    """One token, float64, with log-ratio log(ratio); returns (loss, d loss / d logp, metrics)."""
    old = torch.zeros(1, 1, dtype=torch.float64)
    logps = torch.full((1, 1), math.log(ratio), dtype=torch.float64, requires_grad=True)
    out = policy_loss(
        logps, old, None, torch.tensor([advantage], dtype=torch.float64), torch.ones(1, 1),
        clip_ratio_c=clip_ratio_c,
    )
    out.loss.backward()
    return float(out.loss), float(logps.grad), out.metrics


def test_a_negative_advantage_with_a_huge_ratio_loses_at_most_c_times_the_advantage():
    loss, grad, metrics = _loss(ratio=50.0, advantage=-2.0, clip_ratio_c=3.0)
    assert loss == pytest.approx(6.0)  # 3 * |A|, not 50 * 2
    assert grad == 0.0  # the capped token is not trained
    assert metrics["clip_ratio/dual"] == 1.0


def test_without_the_dual_clip_the_same_token_is_unbounded():
    loss, grad, metrics = _loss(ratio=50.0, advantage=-2.0, clip_ratio_c=None)
    assert loss == pytest.approx(100.0)
    assert grad == pytest.approx(100.0)
    assert metrics["clip_ratio/dual"] == 0.0


@pytest.mark.parametrize(("ratio", "advantage"), [(50.0, 2.0), (0.1, 2.0), (2.9, -2.0), (0.5, -1.0)])
def test_positive_advantages_and_ratios_below_c_are_untouched(ratio, advantage):
    assert _loss(ratio, advantage, 3.0)[:2] == pytest.approx(_loss(ratio, advantage, None)[:2])
    assert _loss(ratio, advantage, 3.0)[2]["clip_ratio/dual"] == 0.0


def test_the_dual_share_counts_masked_tokens_only():
    old = torch.zeros(2, 3, dtype=torch.float64)
    logps = torch.log(torch.tensor([[10.0, 1.0, 10.0], [10.0, 10.0, 1.0]], dtype=torch.float64))
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    out = policy_loss(
        logps, old, None, torch.tensor([-1.0, 1.0], dtype=torch.float64), mask, clip_ratio_c=3.0
    )
    # response tokens: (row 0) ratio 10 bounded, ratio 1 not; (row 1) positive advantage
    assert out.metrics["clip_ratio/dual"] == pytest.approx(1 / 3)
    # token losses: row 0 min(10, 3 * 1) = 3.0 and 1.0; row 1 -min(10, 1.2) * 1 = -1.2
    assert float(out.loss) == pytest.approx((3.0 + 1.0 - 1.2) / 3)


# ------------------------------------------------------------ end-to-end fit
class StepLog(Callback):
    """What each optimiser step logged and how many mini-batches of its round were left."""

    def __init__(self) -> None:
        self.steps: list[dict] = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        logged = trainer.callback_metrics
        self.steps.append(
            {
                "ratio_mean": float(logged["train/ratio_mean"]),
                "dual": float(logged["train/clip_ratio/dual"]),
                "left": len(module.grpo_step.experience),
                "left_rows": [len(b) for b in module.grpo_step.experience],
                "has_old": [b.old_logps is not None for b in module.grpo_step.experience],
            }
        )


def test_a_round_of_eight_samples_with_size_four_trains_two_steps(tmp_path, tiny_model_dir, monkeypatch):
    from memalpha.train.datamodule import RolloutDataModule
    from memalpha.train.module import GRPOModule

    rng = random.Random(0)  # seeded scores, so advantages are nonzero and the first step moves the policy
    monkeypatch.setitem(scoring.METRICS, "substring", lambda prediction, gold: rng.random())
    config = yaml.safe_load((REPO / "configs" / "tiny_cpu.yaml").read_text())
    model = config["model"]
    model.update(model=tiny_model_dir, log_text_every_n_steps=0, export_adapter_dir=str(tmp_path / "adapter"))
    model["reader"].update(max_new_tokens=4)
    model["rollout"].update(group_size=2, max_new_tokens=8, max_prompt_tokens=2048)
    model["update"].update(micro_batch_size=4, mini_batch_size=4, clip_ratio_c=3.0)
    model["optimizer"].update(learning_rate=5e-3)
    data = config["data"]
    # 2 instances x 2 rollouts x 2 chunk turns = 8 turn samples a round
    data["synthetic"].update(train=8, val=1, chunks=2, questions=2, chunk_words=20)
    data.update(instances_per_step=2, tokenizer_name=tiny_model_dir)
    log = StepLog()
    trainer = Trainer(
        accelerator="cpu", devices=1, max_steps=2, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0, num_sanity_val_steps=0,
        default_root_dir=str(tmp_path), callbacks=[log],
    )
    trainer.fit(GRPOModule(**model), datamodule=RolloutDataModule(**data), weights_only=False)
    first, second = log.steps
    assert first["left"] == 1 and first["left_rows"] == [4] and first["has_old"] == [True]
    assert second["left"] == 0  # the round's two mini-batches are spent: the next step rolls out anew
    assert first["ratio_mean"] == pytest.approx(1.0, abs=1e-6)  # the sampling weights
    assert abs(second["ratio_mean"] - 1.0) > 1e-4  # one optimiser step later, the ratio acts
