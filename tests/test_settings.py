"""Typed settings groups, the typed GRPO batch and the update's last step: checked before any model loads."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import yaml

from memalpha.agent.reward_settings import RewardSettings
from memalpha.agent.rollout_settings import RolloutSettings
from memalpha.data.synthetic import SyntheticSettings
from memalpha.grpo.batch import GRPOBatch, cut_minibatches
from memalpha.grpo.optimizer import build_optimizer, warmup_steps
from memalpha.grpo.settings import OptimizerSettings, UpdateSettings
from memalpha.grpo.update import optimizer_step
from memalpha.lm.core.policy import LMSettings, LoraSettings
from memalpha.reader.options import OpenAISettings, RetrievalSettings
from memalpha.reader.settings import ReaderSettings
from memalpha.train.datamodule import RolloutDataModule


@pytest.mark.parametrize(
    ("group", "kwargs", "message"),
    [
        (UpdateSettings, {"clip_low": 1.0}, "update.clip_low"),
        (UpdateSettings, {"kl_coef": -0.1}, "update.kl_coef"),
        (UpdateSettings, {"micro_batch_size": 0}, "update.micro_batch_size"),
        (UpdateSettings, {"loss_agg": "sum"}, "update.loss_agg"),
        (UpdateSettings, {"advantage_scale": "rank"}, "update.advantage_scale"),
        (OptimizerSettings, {"learning_rate": 0.0}, "optimizer.learning_rate"),
        (OptimizerSettings, {"warmup_ratio": 1.0}, "optimizer.warmup_ratio"),
        (OptimizerSettings, {"name": "sgd"}, "optimizer.name"),
        (OptimizerSettings, {"grad_clip": -1.0}, "optimizer.grad_clip"),
        (ReaderSettings, {"kind": "remote"}, "reader.kind"),
        (ReaderSettings, {"max_new_tokens": 0}, "reader.max_new_tokens"),
        (ReaderSettings, {"temperature": -1.0}, "reader.temperature"),
        (ReaderSettings, {"openai": {"base_url": "localhost:8000"}}, "reader.openai.base_url"),
        (ReaderSettings, {"retrieval": {"top_k_entries": -1}}, "reader.retrieval.top_k_entries"),
        (OpenAISettings, {"max_concurrency": 0}, "reader.openai.max_concurrency"),
        (OpenAISettings, {"timeout_s": 0.0}, "reader.openai.timeout_s"),
        (OpenAISettings, {"backoff_s": 5.0, "backoff_max_s": 1.0}, "reader.openai.backoff_s"),
        (RetrievalSettings, {"prompt_tokens": 0}, "reader.retrieval.prompt_tokens"),
        (SyntheticSettings, {"train": 0}, "data.synthetic.train"),
        (SyntheticSettings, {"distractors_per_chunk": -1}, "data.synthetic.distractors_per_chunk"),
        (SyntheticSettings, {"families": ("synth_poetry",)}, "data.synthetic.families"),
        (SyntheticSettings, {"families": ()}, "data.synthetic.families"),
        (RewardSettings, {"content_judge": "human"}, "reward.content_judge"),
        (RewardSettings, {"metric_overrides": {"squad": "bleu"}}, "reward.metric_overrides"),
        (RolloutSettings, {"group_size": 0}, "rollout.group_size"),
        (RolloutSettings, {"temperature": 0.0}, "rollout.temperature"),
        (RolloutSettings, {"call_format": "xml"}, "call format"),
        (RolloutSettings, {"prompt_profile": "tiny"}, "rollout.prompt_profile"),
        (LMSettings, {"precision": "int8"}, "lm.precision"),
        (LoraSettings, {"r": 0}, "lora.r"),
    ],
)
def test_a_bad_value_names_its_option(group, kwargs, message):
    with pytest.raises(ValueError, match=message):
        group(**kwargs)


def test_update_knows_when_a_round_feeds_several_steps():
    assert not UpdateSettings().needs_old_logps(10)
    assert UpdateSettings(num_mini_batches=2).needs_old_logps(10)
    assert UpdateSettings(ppo_epochs=2).needs_old_logps(10)


def _batch(rows: int = 5) -> GRPOBatch:
    return GRPOBatch(
        prompt_ids=[[i, i + 1] for i in range(rows)],
        response_ids=[[10 + i] * (i + 1) for i in range(rows)],
        advantages=torch.arange(rows, dtype=torch.float32),
        old_logps=[torch.full((i + 1,), -float(i)) for i in range(rows)],
        ref_logps=None,
    )


def test_batch_select_keeps_rows_aligned():
    picked = _batch().select([3, 0])
    assert picked.prompt_ids == [[3, 4], [0, 1]]
    assert picked.response_ids == [[13, 13, 13, 13], [10]]
    assert picked.advantages.tolist() == [3.0, 0.0]
    assert [t.tolist() for t in picked.old_logps] == [[-3.0] * 4, [0.0]]
    assert picked.ref_logps is None
    assert len(picked) == 2 and picked.response_tokens == 5


def test_batch_refuses_misaligned_rows():
    with pytest.raises(ValueError, match="advantages"):
        GRPOBatch([[1], [2]], [[3], [4]], torch.zeros(3))
    with pytest.raises(ValueError, match="ref_logps"):
        GRPOBatch([[1], [2]], [[3], [4]], torch.zeros(2), ref_logps=[torch.zeros(1)])


def test_batch_state_round_trips_through_plain_containers():
    batch = _batch()
    state = batch.state_dict()
    assert all(isinstance(row, list) for row in state["prompt_ids"])
    again = GRPOBatch(**state)
    assert again.prompt_ids == batch.prompt_ids and torch.equal(again.advantages, batch.advantages)


def test_cut_minibatches_first_pass_in_order_later_passes_reshuffled():
    batch = _batch(5)
    parts = cut_minibatches(batch, num_mini_batches=2, ppo_epochs=2, seed=7)
    assert len(parts) == 4
    assert [p.advantages.tolist() for p in parts[:2]] == [[0.0, 1.0, 2.0], [3.0, 4.0]]
    second = sorted(a for p in parts[2:] for a in p.advantages.tolist())
    assert second == [0.0, 1.0, 2.0, 3.0, 4.0]  # every sample once per pass
    again = cut_minibatches(batch, num_mini_batches=2, ppo_epochs=2, seed=7)
    assert [p.advantages.tolist() for p in again] == [p.advantages.tolist() for p in parts]
    assert len(cut_minibatches(_batch(2), num_mini_batches=4, ppo_epochs=1, seed=0)) == 2  # one sample each


def test_optimizer_step_clips_and_steps_or_drops_a_nonfinite_update():
    weight = torch.nn.Parameter(torch.tensor([1.0, 1.0]))
    optimizer, scheduler = build_optimizer(
        [weight], OptimizerSettings(learning_rate=0.1, weight_decay=0.0, warmup_ratio=0.0)
    )
    weight.grad = torch.tensor([3.0, 4.0])
    norm = optimizer_step(optimizer, [weight], finite=True, grad_clip=1.0, scheduler=scheduler)
    assert norm == pytest.approx(5.0)
    assert torch.allclose(weight.grad, torch.tensor([0.6, 0.8]))  # clipped to norm 1 before the step
    moved = weight.detach().clone()
    assert not torch.equal(moved, torch.tensor([1.0, 1.0]))
    weight.grad = torch.tensor([float("nan"), 1.0])
    skipped = optimizer_step(optimizer, [weight], finite=False, grad_clip=1.0, scheduler=scheduler)
    assert math.isnan(skipped) and weight.grad is None  # gradients dropped, nothing stepped
    assert torch.equal(weight.detach(), moved)


def test_warmup_counts_optimiser_steps():
    assert warmup_steps(OptimizerSettings(warmup_ratio=0.05), 205) == 11
    assert warmup_steps(OptimizerSettings(warmup_ratio=0.05), 4) == 1
    assert warmup_steps(OptimizerSettings(warmup_ratio=0.0), 100) == 0
    weight = torch.nn.Parameter(torch.zeros(1))
    optimizer, scheduler = build_optimizer(
        [weight], OptimizerSettings(learning_rate=1.0, warmup_ratio=0.5), 4
    )
    rates = []
    for _ in range(4):
        rates.append(optimizer.param_groups[0]["lr"])
        weight.grad = torch.zeros(1)
        optimizer_step(optimizer, [weight], finite=True, grad_clip=0.0, scheduler=scheduler)
    assert rates == pytest.approx([1 / 3, 2 / 3, 1.0, 1.0])


def test_sft_reads_its_limits_where_fit_does(tmp_path, capsys):
    """``memalpha sft`` takes ``data.load.train_limit`` as ``memalpha fit`` does; ``data.train_limit``
    is no option, and SFT's own ``model.micro_batch_size`` is."""
    from memalpha.cli import main
    from memalpha.train.demo_datamodule import DemoDataModule, DemoLoadSettings

    config = str(Path(__file__).resolve().parents[1] / "configs" / "sft_tiny_cpu.yaml")
    with pytest.raises(SystemExit) as info:  # no such option: jsonargparse's refusal, in one line
        main(["sft", "--config", config, "--data.train_limit", "2"])
    assert info.value.code == 2
    assert capsys.readouterr().err.strip() == (
        "memalpha sft: error: unrecognized arguments: --data.train_limit 2 (all options: memalpha sft --help)"
    )
    with pytest.raises(SystemExit) as info:
        main(["sft", "--config", config, "--data.load.train_limit", "2",
              "--model.micro_batch_size", "2", "--print_config"])
    assert info.value.code in (0, None)
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["data"]["load"] == {"train_limit": 2, "val_limit": None}
    with pytest.raises(ValueError, match=r"data\.load\.val_limit must be >= 1"):
        DemoLoadSettings(val_limit=0)
    demos = tmp_path / "demos.jsonl"
    demos.write_text("")
    assert DemoDataModule(train_path=str(demos), load={"train_limit": 3}).load == DemoLoadSettings(
        train_limit=3
    )


def test_nested_groups_arrive_as_dicts_and_keep_their_defaults():
    reader = ReaderSettings(retrieval={"bm25": "okapi"}, openai={"model": "m"})
    assert reader.retrieval == RetrievalSettings(bm25="okapi") and reader.openai == OpenAISettings(model="m")
    data = RolloutDataModule(synthetic={"train": 3, "families": ["synth_icl"]})
    assert data.synthetic == SyntheticSettings(train=3, families=("synth_icl",))
    assert (SyntheticSettings().train, SyntheticSettings().val, SyntheticSettings().chunk_words) == (
        64,
        16,
        100,
    )


def test_cli_refuses_unknown_keys_and_bad_values_before_any_model_loads(tmp_path, capsys):
    from memalpha.cli import main

    missing_model = str(tmp_path / "no-such-model")  # loading it would fail with another error
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text(yaml.safe_dump({"model": {"model": missing_model, "kl_coef": 0.01}}))
    with pytest.raises(SystemExit) as info:
        main(["fit", "--config", str(unknown)])
    assert info.value.code == 2
    line = capsys.readouterr().err.strip()
    assert "fit: error: Subcommand 'fit' does not accept option 'model.kl_coef'" in line and "\n" not in line
    with pytest.raises(SystemExit) as info:  # the settings are checked before the model's path
        main(
            [
                "fit", "--model.model", missing_model, "--model.update.clip_low", "1.5",
                "--trainer.accelerator", "cpu",
            ]
        )
    assert str(info.value) == "memalpha fit: error: model.update.clip_low must be in [0, 1), got 1.5"


def test_each_registry_and_its_literal_name_the_same_choices():
    """A choice list kept as a registry's keys (a dict of implementations) is also a ``Literal`` for
    the settings' type; the two must name the same choices (every other list is derived from its
    ``Literal`` with ``typing.get_args``)."""
    from typing import get_args

    from memalpha.agent.answer_metrics import ANSWER_STYLES, MetricStyle
    from memalpha.agent.reward_math import CALL_SUCCESS
    from memalpha.agent.reward_settings import CallSuccessRule
    from memalpha.reader.retrieval import K_RULES, KReduction
    from memalpha.tools.formats import CALL_FORMATS, CallFormatName
    from memalpha.tools.jsonfix import CALL_REPAIRS, CallRepairName
    from memalpha.train.profiles import PROFILES, ProfileName

    for literal, registry in (
        (CallFormatName, CALL_FORMATS),
        (ProfileName, PROFILES),
        (MetricStyle, ANSWER_STYLES),
        (CallSuccessRule, CALL_SUCCESS),
        (KReduction, K_RULES),
        (CallRepairName, CALL_REPAIRS),
    ):
        assert list(get_args(literal)) == list(registry), (literal, list(registry))
