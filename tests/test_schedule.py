"""The learning-rate schedule and the run's length in epochs (issue 15, difference 8).

The official run (verl) takes 5 epochs over the training parquet with a ``drop_last`` loader of
32 instances a step (567 instances: 85 steps), warms up over ``int(0.05 * 85) = 4`` of those
rollout rounds with verl's constant schedule (multiplier ``round / 4``: the first round trains
at learning rate 0) and steps the scheduler once per round, however many optimiser steps the
round's mini-batches take. memalpha's defaults count optimiser steps and start the warm-up at
``1 / (warmup + 1)``; ``optimizer.schedule_unit: round``, ``optimizer.warmup_start: zero``,
``data.drop_last`` and ``data.epochs`` give the official schedule.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
import yaml
from lightning.pytorch import Callback, Trainer

from memalpha.agent import answer_metrics as scoring
from memalpha.grpo.optimizer import build_optimizer, lr_multiplier, schedule_length, warmup_steps
from memalpha.grpo.settings import OptimizerSettings
from memalpha.train.datamodule import RolloutDataModule, check_data_settings, run_rounds
from memalpha.train.stream import PassCursor, pass_order

REPO = Path(__file__).resolve().parents[1]
OFFICIAL = {"schedule_unit": "round", "warmup_start": "zero"}


# ------------------------------------------------------------ the multiplier
def test_official_85_rounds_warm_up_over_4_from_zero():
    settings = OptimizerSettings(warmup_ratio=0.05, **OFFICIAL)
    assert warmup_steps(settings, 85) == 4  # int(4.25)
    assert [lr_multiplier(r, 4, "zero") for r in range(7)] == [0.0, 0.25, 0.5, 0.75, 1.0, 1.0, 1.0]


def test_default_85_steps_warm_up_over_5_from_one_sixth():
    settings = OptimizerSettings(warmup_ratio=0.05)
    assert settings.schedule_unit == "optimizer_step" and settings.warmup_start == "one_step"
    assert warmup_steps(settings, 85) == 5  # ceil(4.25)
    assert [lr_multiplier(s, 5, "one_step") for s in range(7)] == [
        1 / 6,
        2 / 6,
        3 / 6,
        4 / 6,
        5 / 6,
        1.0,
        1.0,
    ]


@pytest.mark.parametrize(
    ("ratio", "total", "one_step", "zero"),
    [
        (0.05, 10, 1, 0),
        (0.05, 19, 1, 0),
        (0.05, 20, 1, 1),
        (0.05, 100, 5, 5),
        (0.1, 85, 9, 8),
        (0.0, 85, 0, 0),
        (0.05, 0, 0, 0),
    ],
)
def test_warmup_length_ceil_for_one_step_floor_for_zero(ratio, total, one_step, zero):
    assert warmup_steps(OptimizerSettings(warmup_ratio=ratio), total) == one_step
    assert warmup_steps(OptimizerSettings(warmup_ratio=ratio, warmup_start="zero"), total) == zero


def test_no_warm_up_is_the_peak_from_the_first_step_in_both_styles():
    assert lr_multiplier(0, 0, "zero") == 1.0
    assert lr_multiplier(0, 0, "one_step") == 1.0


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        (
            OptimizerSettings(learning_rate=1e-3, warmup_ratio=0.05, **OFFICIAL),
            [0.0, 2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3],
        ),
        (OptimizerSettings(learning_rate=1.2e-3, warmup_ratio=0.05), [2e-4, 4e-4, 6e-4, 8e-4, 1e-3, 1.2e-3]),
    ],
)
def test_the_built_scheduler_follows_the_multiplier(settings, expected):
    weight = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))
    optimizer, scheduler = build_optimizer([weight], settings, 85)
    seen = []
    for _ in expected:
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert seen == pytest.approx(expected, rel=1e-12, abs=1e-18)


def test_schedule_length_in_each_unit():
    default = OptimizerSettings()
    assert schedule_length(default, max_steps=205) == 205
    assert schedule_length(default, max_steps=-1, run_rounds=85) == 0  # optimiser steps: max_steps only
    rounds = OptimizerSettings(**OFFICIAL)
    assert schedule_length(rounds, max_steps=205, run_rounds=85, steps_per_round=2) == 85  # epochs win
    assert schedule_length(rounds, max_steps=9, steps_per_round=2) == 5  # ceil(9 / 2) rounds
    assert schedule_length(OptimizerSettings(warmup_ratio=0.0, **OFFICIAL), max_steps=-1) == 0
    with pytest.raises(
        ValueError, match=r"^optimizer\.schedule_unit=round needs .* set data\.epochs \("
    ) as error:
        schedule_length(rounds, max_steps=205)  # mini_batch_size: the steps per round vary
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"schedule_unit": "epoch"}, r"^optimizer\.schedule_unit must be one of"),
     ({"warmup_start": "one"}, r"^optimizer\.warmup_start must be one of")],
)
def test_bad_schedule_settings_fail_naming_the_option(kwargs, message):
    with pytest.raises(ValueError, match=message):
        OptimizerSettings(**kwargs)


# --------------------------------------------------------------- run length
@pytest.mark.parametrize(
    ("instances", "per_step", "world", "epochs", "drop_last", "rounds"),
    [(567, 32, 1, 5, True, 85), (567, 4, 8, 5, True, 85), (567, 32, 1, 5, False, 89), (10, 3, 1, 1, True, 3),
     (10, 3, 1, 2, True, 6), (10, 3, 1, 2, False, 7), (11, 3, 2, 1, True, 1)],
)
def test_run_rounds(instances, per_step, world, epochs, drop_last, rounds):
    assert run_rounds(instances, per_step, world, epochs, drop_last) == rounds


def test_a_pass_too_small_for_one_round_is_refused_with_drop_last():
    with pytest.raises(ValueError, match=r"^data\.drop_last: a pass has 2 instances per rank"):
        run_rounds(5, 3, 2, 1, True)
    with pytest.raises(ValueError, match="cannot fill one take of 3 with drop_last"):
        PassCursor().take(3, lambda epoch: [0, 1], drop_last=True)


@pytest.mark.parametrize(
    ("change", "message"),
    [({"epochs": 0}, r"^data\.epochs must be an integer >= 1 or null, got 0$"),
     ({"epochs": 1.5}, r"^data\.epochs must be")],
)
def test_bad_data_length_settings_fail_naming_the_option(change, message):
    with pytest.raises(ValueError, match=message):
        RolloutDataModule(**change)
    data = dict(RolloutDataModule().hparams)
    data.update(change)
    with pytest.raises(ValueError, match=message):
        check_data_settings(data)


# ---------------------------------------------------------- the stream order
def test_drop_last_skips_the_tenth_of_ten_in_rounds_of_three():
    orders = {epoch: pass_order(10, 0, epoch) for epoch in range(2)}
    dropping, wrapping = PassCursor(), PassCursor()
    taken = [dropping.take(3, orders.__getitem__, drop_last=True) for _ in range(4)]
    first, second = orders[0], orders[1]
    assert taken == [first[0:3], first[3:6], first[6:9], second[0:3]]
    assert (dropping.epoch, dropping.cursor) == (1, 3)
    # without drop_last the fourth round is the pass's last instance and the next pass's first two
    assert [wrapping.take(3, orders.__getitem__) for _ in range(4)][3] == [first[9], second[0], second[1]]


def _datamodule(**kwargs) -> RolloutDataModule:
    options = {"synthetic": {"train": 10, "val": 1}, "instances_per_step": 3, "drop_last": True, "epochs": 2}
    module = RolloutDataModule(**{**options, **kwargs})
    module.setup("fit")
    return module


def _ids(module: RolloutDataModule, epoch: int) -> list[str]:
    return [module.train_instances[index].instance_id for index in module.shard_order(epoch)]


def test_two_epochs_with_drop_last_serve_six_rounds_then_the_loader_ends():
    module = _datamodule()
    assert module.total_rounds() == 6
    rounds = list(module.train_dataloader())
    assert [r.index for r in rounds] == list(range(6))
    first, second = _ids(module, 0), _ids(module, 1)
    assert first != second  # each pass is reshuffled
    served = [[inst.instance_id for inst in r.instances] for r in rounds]
    assert served == [first[0:3], first[3:6], first[6:9], second[0:3], second[3:6], second[6:9]]
    assert first[9] not in served[0] + served[1] + served[2]
    assert module.next_round() is None
    assert module.state_dict() == {"epoch": 1, "cursor": 9, "round": 6}


def test_without_epochs_the_stream_is_endless():
    module = _datamodule(epochs=None)
    assert module.total_rounds() is None
    assert all(module.next_round() is not None for _ in range(20))


@pytest.mark.parametrize("stop_after", [1, 3, 4, 6])
def test_a_resumed_stream_serves_what_the_whole_one_would(stop_after):
    whole = [[i.instance_id for i in r.instances] for r in _datamodule().train_dataloader()]
    first = _datamodule()
    head = [first.next_round() for _ in range(stop_after)]
    state = first.state_dict()
    resumed = _datamodule()
    resumed.load_state_dict(state)
    tail = list(resumed.train_dataloader())
    assert [r.index for r in head + tail] == list(range(6))
    assert [[i.instance_id for i in r.instances] for r in head + tail] == whole
    if stop_after == 3:  # the pass's leftover is skipped when the next round is taken
        assert state == {"epoch": 0, "cursor": 9, "round": 3}


# ---------------------------------------------------------------- the CLI
def test_the_knobs_parse_from_the_command_line(capsys):
    from memalpha.cli import main

    flags = ["--data.epochs", "5", "--data.drop_last", "true", "--model.optimizer.schedule_unit", "round",
             "--model.optimizer.warmup_start", "zero"]
    with pytest.raises(SystemExit) as info:
        main(["fit", "--config", str(REPO / "configs" / "tiny_cpu.yaml"), *flags, "--print_config"])
    assert info.value.code in (0, None)
    config = yaml.safe_load(capsys.readouterr().out)
    assert config["data"]["epochs"] == 5 and config["data"]["drop_last"] is True
    assert config["model"]["optimizer"]["schedule_unit"] == "round"
    assert config["model"]["optimizer"]["warmup_start"] == "zero"


# ------------------------------------------------------------ end-to-end fit
class LearningRates(Callback):
    """The learning rate of every optimiser step, read just before the step, and its ratio."""

    def __init__(self) -> None:
        self.lrs: list[float] = []
        self.ratios: list[float] = []

    def on_before_optimizer_step(self, trainer, module, optimizer) -> None:
        self.lrs.append(optimizer.param_groups[0]["lr"])

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        if "train/ratio_mean" in trainer.callback_metrics:
            self.ratios.append(float(trainer.callback_metrics["train/ratio_mean"]))


def _fit_settings(tmp_path: Path, model_dir: str) -> tuple[dict, dict]:
    """tiny_cpu.yaml as GRPOModule and RolloutDataModule arguments: the official schedule over
    3 rounds (7 instances, 2 a round, drop_last, 1 epoch) of two mini-batches each."""
    config = yaml.safe_load((REPO / "configs" / "tiny_cpu.yaml").read_text())
    model = config["model"]
    model.update(model=model_dir, log_text_every_n_steps=0, export_adapter_dir=str(tmp_path / "adapter"))
    model["reader"].update(max_new_tokens=4)
    model["rollout"].update(group_size=2, max_new_tokens=8, max_prompt_tokens=2048)
    # 2 instances x 2 rollouts x 2 chunk turns = 8 turn samples a round: two optimiser steps of 4
    model["update"].update(micro_batch_size=4, mini_batch_size=4)
    # int(0.67 * 3 rounds) = 2 warm-up rounds: multipliers 0, 1/2, then 1
    model["optimizer"].update(
        learning_rate=5e-3, warmup_ratio=0.67, schedule_unit="round", warmup_start="zero"
    )
    data = config["data"]
    # 7 instances, 2 a round, drop_last: 3 rounds a pass, the 7th instance of the pass skipped
    data["synthetic"].update(train=7, val=1, chunks=2, questions=2, chunk_words=20)
    data.update(instances_per_step=2, drop_last=True, epochs=1, tokenizer_name=model_dir)
    return model, data


def _trainer(tmp_path: Path, log: Callback, max_steps: int = -1) -> Trainer:
    from lightning.pytorch.callbacks import ModelCheckpoint

    checkpoints = ModelCheckpoint(
        dirpath=str(tmp_path / "ckpt"), every_n_train_steps=1, save_top_k=0, save_last=True
    )
    return Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=max_steps,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        default_root_dir=str(tmp_path),
        callbacks=[log, checkpoints],
    )


def test_round_unit_gives_both_mini_batches_of_a_round_its_rate_and_epochs_end_the_run(
    tmp_path, tiny_model_dir, monkeypatch
):
    from memalpha.train.module import GRPOModule

    # seeded scores: nonzero advantages, so a step at a learning rate > 0 moves the policy
    rng = random.Random(0)
    monkeypatch.setitem(scoring.METRICS, "substring", lambda prediction, gold: rng.random())
    model, data = _fit_settings(tmp_path, tiny_model_dir)
    log = LearningRates()
    datamodule = RolloutDataModule(**data)
    trainer = _trainer(tmp_path, log)
    module = GRPOModule(**model)
    trainer.fit(module, datamodule=datamodule, weights_only=False)

    assert trainer.global_step == 6  # 3 rounds x 2 mini-batches, then the stream ended the run
    assert log.lrs == pytest.approx([0.0, 0.0, 2.5e-3, 2.5e-3, 5e-3, 5e-3], rel=1e-12, abs=0.0)
    assert module.lr_schedulers().last_epoch == 3  # stepped once per round, not per optimiser step
    # round 0 trained at learning rate 0: its second mini-batch still sees the sampling weights
    assert log.ratios[1] == pytest.approx(1.0, abs=1e-6)
    assert abs(log.ratios[3] - 1.0) > 1e-4  # round 1's first step (lr 2.5e-3) moved the policy
    ids = _ids(datamodule, 0)
    assert datamodule.seen_instance_ids == ids[:6]  # the pass's 7th instance is skipped


def test_a_run_resumed_mid_round_keeps_the_rates_and_ends_with_the_epochs(tmp_path, tiny_model_dir):
    from memalpha.train.module import GRPOModule

    model, data = _fit_settings(tmp_path, tiny_model_dir)
    first = LearningRates()
    _trainer(tmp_path, first, max_steps=3).fit(GRPOModule(**model), datamodule=RolloutDataModule(**data))
    assert first.lrs == pytest.approx([0.0, 0.0, 2.5e-3], rel=1e-12, abs=0.0)  # stopped inside round 1
    second = LearningRates()
    datamodule = RolloutDataModule(**data)
    trainer = _trainer(tmp_path, second)
    trainer.fit(GRPOModule(**model), datamodule=datamodule, ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"),
                weights_only=False)
    assert trainer.global_step == 6
    # round 1's unserved mini-batch at its rate, then round 2 (no rollout of round 1 again)
    assert second.lrs == pytest.approx([2.5e-3, 5e-3, 5e-3], rel=1e-12, abs=0.0)
    assert datamodule.seen_instance_ids == _ids(datamodule, 0)[4:6]
