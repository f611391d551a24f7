"""A NaN or infinity skips the step, is logged, and three in a row stop the run (issue 16, item 4).

Faults go into the real code path of short fits of a tiny random model (the real
``GRPOModule``/``RolloutDataModule`` or ``SFTModule``/``DemoDataModule`` under a Lightning
``Trainer``), at the training-step calls a :class:`FaultPlan` names:

* **rewards**: the answer metric of the synthetic sources returns NaN, so the reader's answers,
  ``rollout_rewards`` and the module's round run as in a real run (on other calls it returns
  seeded random scores, so advantages are nonzero and a trained step moves the adapter);
* **log-probs**: a forward hook on the output head. Only the log-prob passes feed it rows of
  response positions (2-D); generation feeds it ``[B, T, H]`` batches. Without grad those are
  the round's reference/old passes, with grad the loss's pass;
* **loss**: old log-probs made very negative (finite) make the PPO ratio overflow to inf;
* **gradient norm**: a hook on the head's output multiplies the gradient flowing back by inf.
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
from memalpha.grpo.update import NonFiniteStreak, NonFiniteTrainingError, optimizer_step
from memalpha.train.policy_module import NONFINITE_STREAK_KEY

REPO = Path(__file__).resolve().parents[1]


class FaultPlan(Callback):
    """Which fault each training-step call gets, and what each call did to the adapter and logged."""

    def __init__(self, faults: dict[int, str]) -> None:
        self.faults = faults
        self.now: str | None = None
        self.calls: list[dict] = []
        self._before: list[torch.Tensor] = []

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        self.now = self.faults.get(len(self.calls))
        self._before = [p.detach().clone() for p in module.trainable_parameters()]

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        after = module.trainable_parameters()
        logged = trainer.callback_metrics
        self.calls.append(
            {
                "fault": self.now,
                "moved": sum(float((p.detach() - b).norm()) for p, b in zip(after, self._before)),
                "unchanged": all(torch.equal(p.detach(), b) for p, b in zip(after, self._before)),
                "skipped": float(logged["train/skipped_nonfinite"]),
                "grad_norm": float(logged["train/grad_norm"]),
                "loss": float(logged["train/loss"]) if "train/loss" in logged else math.nan,
                "global_step": trainer.global_step,
            }
        )
        self.now = None


def inject(module, plan: FaultPlan, monkeypatch) -> None:
    """Wire ``plan``'s faults into the answer metric and the policy's output head."""
    rng = random.Random(0)

    def metric(prediction, gold) -> float:
        return math.nan if plan.now == "rewards" else rng.random()

    monkeypatch.setitem(scoring.METRICS, "substring", metric)

    def head_hook(head, inputs, output):
        if output.dim() != 2 or plan.now is None:  # generation, or no fault now
            return None
        grad = torch.is_grad_enabled()
        if plan.now == "reference log-probs" and not grad or plan.now == "policy log-probs" and grad:
            return output * math.nan
        if plan.now == "old log-probs overflow" and not grad:
            return output * 1e4  # finite, but far below the policy's: exp(logp - old) overflows
        if plan.now == "grad norm" and grad and output.requires_grad:
            output.register_hook(lambda g: g * math.inf)
        return None

    module.policy.get_output_embeddings().register_forward_hook(head_hook)


class Injected(Callback):
    """Installs the faults once the policy exists (``configure_model`` runs inside ``fit``)."""

    def __init__(self, plan: FaultPlan, monkeypatch) -> None:
        self.plan, self.monkeypatch = plan, monkeypatch

    def on_fit_start(self, trainer, module) -> None:
        inject(module, self.plan, self.monkeypatch)


def grpo(model_dir: str, out: Path, update: dict | None = None):
    """GRPOModule and RolloutDataModule of configs/tiny_cpu.yaml, shrunk to a couple of seconds a step."""
    from memalpha.train.datamodule import RolloutDataModule
    from memalpha.train.module import GRPOModule

    config = yaml.safe_load((REPO / "configs" / "tiny_cpu.yaml").read_text())
    model = config["model"]
    model.update(model=model_dir, log_text_every_n_steps=0, export_adapter_dir=str(out / "adapter"))
    model["reader"].update(max_new_tokens=4)
    model["rollout"].update(group_size=2, max_new_tokens=8, max_prompt_tokens=2048)
    model["update"].update({"micro_batch_size": 4, **(update or {})})
    data = config["data"]
    data["synthetic"].update(train=8, val=1, chunks=1, questions=2, chunk_words=20)
    data.update(instances_per_step=2, tokenizer_name=model_dir)
    return GRPOModule(**model), RolloutDataModule(**data)


def fit(
    module, datamodule, plan: FaultPlan, monkeypatch, out: Path, max_steps: int, ckpt_path=None, extra=()
):
    trainer = Trainer(
        accelerator="cpu", devices=1, max_steps=max_steps, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0, num_sanity_val_steps=0,
        default_root_dir=str(out), callbacks=[Injected(plan, monkeypatch), plan, *extra],
    )
    # hparams hold dataclasses
    trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path, weights_only=False)
    return trainer


def assert_skipped(call: dict) -> None:
    assert call["skipped"] == 1.0 and call["unchanged"], call


def assert_trained(call: dict) -> None:
    assert call["skipped"] == 0.0 and call["moved"] > 0 and math.isfinite(call["grad_norm"]), call


def test_a_nan_reward_drops_the_round_and_the_run_trains_on(tmp_path, tiny_model_dir, monkeypatch):
    plan = FaultPlan({1: "rewards"})
    module, data = grpo(tiny_model_dir, tmp_path)
    with pytest.warns(UserWarning, match="non-finite rewards"):
        trainer = fit(module, data, plan, monkeypatch, tmp_path, max_steps=3)
    assert [c["fault"] for c in plan.calls] == [None, "rewards", None, None]
    assert_trained(plan.calls[0])
    assert_skipped(plan.calls[1])
    assert_trained(plan.calls[2])
    assert_trained(plan.calls[3])
    assert trainer.global_step == 3  # the skipped step did not count
    assert module.nonfinite_streak.count == 0


def test_nan_log_probs_skip_their_step_before_or_in_the_loss(tmp_path, tiny_model_dir, monkeypatch):
    plan = FaultPlan({1: "reference log-probs", 2: "policy log-probs"})
    module, data = grpo(tiny_model_dir, tmp_path)
    with pytest.warns(UserWarning) as warned:
        fit(module, data, plan, monkeypatch, tmp_path, max_steps=2)
    messages = " ".join(str(w.message) for w in warned)
    assert "non-finite reference log-probs" in messages and "non-finite loss" in messages
    assert_trained(plan.calls[0])
    assert_skipped(plan.calls[1])
    assert_skipped(plan.calls[2])
    assert math.isnan(plan.calls[2]["loss"])
    assert_trained(plan.calls[3])


def test_a_ratio_overflow_makes_the_loss_infinite_and_skips_both_steps_of_its_round(
    tmp_path, tiny_model_dir, monkeypatch
):
    plan = FaultPlan({0: "old log-probs overflow"})
    module, data = grpo(tiny_model_dir, tmp_path, {"kl_coef": 0.0, "num_mini_batches": 2})
    with pytest.warns(UserWarning, match="non-finite loss"):
        fit(module, data, plan, monkeypatch, tmp_path, max_steps=2)
    first, second = plan.calls[0], plan.calls[1]  # the two mini-batches of the faulty round
    assert_skipped(first)
    assert_skipped(second)
    assert first["loss"] == math.inf and second["loss"] == math.inf
    assert_trained(plan.calls[2])
    assert_trained(plan.calls[3])


def test_three_in_a_row_stop_the_run_naming_count_step_and_value(tmp_path, tiny_model_dir, monkeypatch):
    plan = FaultPlan({1: "rewards", 2: "reference log-probs", 3: "grad norm"})
    module, data = grpo(tiny_model_dir, tmp_path)
    with pytest.warns(UserWarning), pytest.raises(NonFiniteTrainingError) as stopped:
        fit(module, data, plan, monkeypatch, tmp_path, max_steps=10)
    message = str(stopped.value)
    assert "\n" not in message
    assert message.startswith("non-finite values in 3 consecutive optimiser steps")
    assert "max_consecutive_nonfinite=3" in message and "at global step 1" in message
    assert message.endswith("had non-finite grad norm; stopping rather than training on garbage"
                            " (see docs/metrics_and_rewards.md)")
    assert len(plan.calls) == 3  # the third skipped step raised before its end
    assert_trained(plan.calls[0])
    assert_skipped(plan.calls[1])
    assert_skipped(plan.calls[2])


def test_the_streak_survives_a_checkpoint(tmp_path, tiny_model_dir, monkeypatch):
    """Two skipped steps, a checkpoint, then a resumed run whose first step is non-finite: it stops."""
    checkpoint = tmp_path / "mid-streak.ckpt"

    class SaveAfterSecondSkip(Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
            if len(plan.calls) == 3:
                trainer.save_checkpoint(checkpoint)

    plan = FaultPlan({1: "rewards", 2: "rewards"})
    module, data = grpo(tiny_model_dir, tmp_path)
    with pytest.warns(UserWarning):
        fit(module, data, plan, monkeypatch, tmp_path, max_steps=2, extra=[SaveAfterSecondSkip()])
    assert [c["skipped"] for c in plan.calls] == [0.0, 1.0, 1.0, 0.0]
    assert torch.load(checkpoint, weights_only=False)[NONFINITE_STREAK_KEY] == 2

    resumed = FaultPlan({0: "rewards"})
    module, data = grpo(tiny_model_dir, tmp_path)
    stop = pytest.raises(NonFiniteTrainingError, match="^non-finite values in 3 consecutive")
    with pytest.warns(UserWarning), stop:
        fit(module, data, resumed, monkeypatch, tmp_path, max_steps=10, ckpt_path=str(checkpoint))


def test_the_cli_stops_with_one_line(tmp_path, tiny_model_dir, monkeypatch):
    from test_training import write_config

    from memalpha.cli import main

    monkeypatch.setitem(scoring.METRICS, "substring", lambda prediction, gold: math.nan)
    config = write_config(tmp_path, tiny_model_dir, max_steps=2, instances_per_step=1)
    with pytest.raises(SystemExit) as stopped:
        main(["fit", "--config", str(config), "--model.optimizer.max_consecutive_nonfinite", "1"])
    message = str(stopped.value.code)
    assert message.startswith("memalpha fit: error: non-finite values in 1 consecutive optimiser step "), (
        message
    )
    assert "had non-finite rewards" in message and "\n" not in message


class DDPFaultProbe(Callback):
    """Run by each DDP rank of the test below: rank 1 gets a NaN reward at call 1, rank 0 NaN
    reference log-probs at call 3 and an infinite gradient at call 4; each rank saves what it saw."""

    def __init__(self, out_dir: str) -> None:
        self.out_dir = Path(out_dir)
        self.plan = FaultPlan({})

    def on_fit_start(self, trainer, module) -> None:
        self.plan.faults = (
            {1: "rewards"} if trainer.global_rank == 1 else {3: "reference log-probs", 4: "grad norm"}
        )
        inject(module, self.plan, pytest.MonkeyPatch())

    def on_train_batch_start(self, *args) -> None:
        self.plan.on_train_batch_start(*args)

    def on_train_batch_end(self, *args) -> None:
        self.plan.on_train_batch_end(*args)

    def on_train_end(self, trainer, module) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        lora = {n: p.detach().clone() for n, p in module.policy.named_parameters() if p.requires_grad}
        torch.save({"calls": self.plan.calls, "lora": lora}, self.out_dir / f"rank{trainer.global_rank}.pt")


@pytest.mark.slow
def test_ddp_ranks_skip_together_whichever_rank_saw_the_fault(tmp_path, tiny_model_dir):
    import os
    import subprocess
    import sys

    from test_training import write_config

    config = write_config(tmp_path, tiny_model_dir, max_steps=3, instances_per_step=1)
    probe_dir = tmp_path / "probe"
    env = dict(os.environ, PYTHONPATH=str(REPO / "tests"), HF_HUB_OFFLINE="1")
    cmd = [
        str(Path(sys.executable).with_name("memalpha")), "fit", "--config", str(config),
        "--trainer.devices", "2", "--trainer.strategy", "ddp",
        "--trainer.callbacks+=test_nonfinite.DDPFaultProbe", f"--trainer.callbacks.out_dir={probe_dir}",
    ]
    proc = subprocess.run(
        cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    ranks = [torch.load(probe_dir / f"rank{rank}.pt", weights_only=False) for rank in (0, 1)]
    skipped = [[call["skipped"] for call in rank["calls"]] for rank in ranks]
    assert skipped[0] == skipped[1] == [0.0, 1.0, 0.0, 1.0, 1.0, 0.0], skipped
    for rank in ranks:
        assert all(call["unchanged"] == bool(call["skipped"]) for call in rank["calls"]), rank["calls"]
    for name, value in ranks[0]["lora"].items():
        assert torch.equal(value, ranks[1]["lora"][name]), name


def test_sft_skips_a_nan_loss_and_stops_after_three(tmp_path, tiny_model_dir, tokenizer, monkeypatch):
    from memalpha.agent.oracle_demos import oracle_demonstrations
    from memalpha.agent.rollout_settings import RolloutSettings
    from memalpha.data.demo_files import save_demonstrations
    from memalpha.data.synthetic import generate_synthetic
    from memalpha.train.demo_datamodule import DemoDataModule
    from memalpha.train.sft_module import SFTModule

    instances = generate_synthetic(2, split="train", seed=0, num_chunks=1, facts_per_chunk=1,
                                   questions_per_instance=1, chunk_words=20, families=("synth_personal",))
    demos = tmp_path / "demos.jsonl"
    settings = RolloutSettings(call_format="hermes", max_new_tokens=96, max_prompt_tokens=2048)
    save_demonstrations(demos, oracle_demonstrations(instances, tokenizer, settings))
    module = SFTModule(model=tiny_model_dir, micro_batch_size=2, export_adapter_dir=str(tmp_path / "adapter"))
    data = DemoDataModule(train_path=str(demos), batch_size=2, tokenizer_name=tiny_model_dir)
    plan = FaultPlan({1: "policy log-probs", 3: "policy log-probs", 4: "grad norm", 5: "policy log-probs"})
    with pytest.warns(UserWarning), pytest.raises(NonFiniteTrainingError, match="non-finite loss"):
        fit(module, data, plan, monkeypatch, tmp_path, max_steps=10)
    assert len(plan.calls) == 5
    assert_trained(plan.calls[0])
    assert_skipped(plan.calls[1])
    assert_trained(plan.calls[2])  # one good step ends the streak
    assert_skipped(plan.calls[3])
    assert_skipped(plan.calls[4])
    assert not math.isfinite(plan.calls[4]["grad_norm"])


def test_the_single_turn_trainer_follows_the_same_rule(tiny_model_dir):
    from memalpha.grpo.settings import OptimizerSettings
    from memalpha_lab.single_turn import SingleTurnSettings, train_single_turn

    steps = iter(range(8))

    def reward(prompts, completions):  # NaN at steps 1, 3, 4 and 5; seeded random scores otherwise
        step = next(steps)
        rng = random.Random(step)
        return [math.nan if step in (1, 3, 4, 5) else rng.random() for _ in completions]

    settings = SingleTurnSettings(steps=8, prompts_per_step=1, group_size=4, max_new_tokens=4,
                                  optimizer=OptimizerSettings(learning_rate=1e-2, warmup_ratio=0.0))
    history = []
    with pytest.warns(RuntimeWarning, match="non-finite rewards"), pytest.raises(
        NonFiniteTrainingError, match="3 consecutive optimiser steps.*global step 5, had non-finite rewards"
    ):
        train_single_turn(
            tiny_model_dir, ["Remember: Anna likes tea."], reward, settings, on_step=history.append
        )
    assert [h["skipped_nonfinite"] for h in history] == [0.0, 1.0, 0.0, 1.0, 1.0, 1.0]
    assert math.isfinite(history[2]["grad_norm"]) and math.isnan(history[1]["grad_norm"])


def test_optimizer_step_drops_gradients_whose_norm_is_not_finite():
    from memalpha.grpo.optimizer import build_optimizer
    from memalpha.grpo.settings import OptimizerSettings

    weight = torch.nn.Parameter(torch.tensor([1.0, 1.0]))
    optimizer, scheduler = build_optimizer([weight], OptimizerSettings(learning_rate=0.1, warmup_ratio=0.0))
    for clip in (1.0, 0.0):
        weight.grad = torch.tensor([math.inf, 1.0])
        norm = optimizer_step(optimizer, [weight], finite=True, grad_clip=clip, scheduler=scheduler)
        assert norm == math.inf and weight.grad is None
        assert torch.equal(weight.detach(), torch.tensor([1.0, 1.0]))
    weight.grad = torch.tensor([3.0, 4.0])
    assert optimizer_step(
        optimizer, [weight], finite=True, grad_clip=0.0, scheduler=scheduler
    ) == pytest.approx(5.0)
    assert not torch.equal(weight.detach(), torch.tensor([1.0, 1.0]))


def test_the_streak_counts_only_steps_in_a_row():
    streak = NonFiniteStreak(limit=2)
    assert "1 in a row" in streak.update("loss", step=4)
    assert streak.update(None, step=5) is None and streak.count == 0
    streak.update("rewards", step=5)
    with pytest.raises(NonFiniteTrainingError, match="at global step 5, had non-finite grad norm"):
        streak.update("grad norm", step=5)


def test_the_limit_is_a_checked_optimizer_setting():
    from memalpha.grpo.settings import OptimizerSettings

    assert OptimizerSettings().max_consecutive_nonfinite == 3
    with pytest.raises(ValueError, match="optimizer.max_consecutive_nonfinite must be >= 1, got 0"):
        OptimizerSettings(max_consecutive_nonfinite=0)
