"""memalpha's GRPO update and TRL's ``GRPOTrainer`` on one identical batch, number against number.

The learning-parity check (``parity.py``) compares the rewards of whole training runs and cannot
resolve a difference below its noise. This check takes sampling and optimisation out: one
hand-built batch (the same prompts, responses, advantages, old and reference log-probs, and one
float64 LoRA policy loaded twice) goes through

- memalpha's update path, the functions ``GRPOModule.training_step`` calls:
  :func:`memalpha.lm.logprobs.per_token.token_logprobs` for the per-token log-probs and
  :func:`memalpha.grpo.update.accumulate_grpo_gradients` (which runs
  :func:`memalpha.grpo.update.micro_batch_loss` and :func:`memalpha.grpo.loss.policy_loss`)
  for the loss and the LoRA gradient;
- TRL's: a real ``trl.GRPOTrainer`` configured the same way (clip range, KL coefficient, loss
  type, micro-batches and gradient accumulation, temperature), whose own
  ``_get_per_token_logps_and_entropies`` and ``_compute_loss`` are called micro-batch by
  micro-batch on the inputs dict its ``_generate_and_score_completions`` would hand them, with
  ``current_gradient_accumulation_steps`` set as its training loop sets it, one ``backward`` each.

Loss aggregation, memalpha ``model.update.loss_agg`` against TRL ``loss_type``
(:data:`TRL_LOSS_TYPE`): ``token-mean`` (sum over every response token of the mini-batch /
their count) is TRL's ``dapo`` (normalised by ``num_items_in_batch``, the generation batch's
token count); ``seq-mean-token-mean`` (each sequence's token mean, then the mean over sequences)
is ``grpo``; ``seq-mean-token-sum-norm`` (each sequence's token sum / the response cap, then the
mean over sequences; Dr. GRPO) is ``dr_grpo`` with ``max_completion_length`` the cap. The KL
term is the k3 estimator on both sides (TRL ``beta`` = memalpha ``kl_coef``, TRL's importance
correction of the KL term off, as memalpha has none).

Two comparisons per setting (:func:`compare_setting`):

- **end to end**: each side computes its own log-probs. memalpha's are float64 throughout (held
  against a float64 log-softmax of the full logits, :func:`reference_logps`). TRL's fused LM head
  (``trl.kernels.chunked_logprob``) keeps its log-sum-exp statistics and its hidden-state
  gradient in float32 even for a float64 model, and its training forward numbers the positions of
  a left-padded row from the first pad column (below), so the sides agree to float32 rounding;
  :data:`TOLERANCES` holds the bounds.
- **same log-probs**: TRL's loss is fed memalpha's float64 log-probs (its log-prob function is
  replaced on the trainer instance; everything after it is TRL's ``_compute_loss``), and memalpha's
  :func:`~memalpha.grpo.update.micro_batch_loss` takes the same tensor: loss and gradient with
  respect to the log-probs then compare in float64.

Where the two differ by design (``docs/results.md``, "Learning parity"; each tested in
``tests/test_trl_exact_parity.py``): memalpha clamps the k3 term (log-ratio to ±20, the per-token
KL to at most 10), TRL does not; TRL's ``bnpo`` divides each micro-batch by its own token count
(memalpha's ``token-mean`` always uses the mini-batch's, as ``dapo`` does while a generation
batch makes one optimiser step, ``steps_per_generation`` = gradient accumulation, as here; with
more steps per generation ``dapo`` divides by their mean token count); TRL's training forward
passes no position ids, so a left-padded row is numbered from its first pad column while memalpha
and ``generate`` number from its first real token (equal scores under RoPE in exact arithmetic,
float32 rounding apart through the float32 rotary tables; a model with absolute positions would
differ for real); TRL's group advantages divide by the Bessel-corrected std plus 1e-4, memalpha's
by the population std plus 1e-6. The advantages are an input here, the same tensor on both sides.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from memalpha_lab.common import machine_info, print_table, write_json

TRL_LOSS_TYPE = {"token-mean": "dapo", "seq-mean-token-mean": "grpo", "seq-mean-token-sum-norm": "dr_grpo"}
"""memalpha ``loss_agg`` -> the TRL ``loss_type`` that aggregates the same way."""

TOLERANCES = {
    "logprob_memalpha_vs_fp64": 1e-12,
    "logprob_max_abs": 1e-5,
    "loss_abs": 1e-6,
    "grad_max_abs_rel": 1e-5,
    "same_logps_loss_abs": 1e-12,
    "same_logps_grad_max_abs": 1e-12,
}
"""Bounds of the differences. memalpha's log-probs are float64: within 1e-12 of a float64
log-softmax. End to end TRL's float32 steps set the bounds: its fused head's log-sum-exp over the
49,152-token vocabulary is rounded to float32 (relative 6e-8 of a value near 11, about 1e-6
absolute) and its left-padded rows go through float32 rotary tables at other positions (below
1e-6); the loss moves by that times the advantages, and the gradient's largest entry by that share
(``grad_max_abs_rel``: max |g_m - g_t| / max |g_t|). Measured values sit about 8 times below these
bounds (``experiments/results/bench_vs_trl_exact.json``). With the same float64 log-probs only
float64 rounding is left."""


@dataclass(frozen=True)
class ExactSetting:
    """One comparison: memalpha ``loss_agg`` (TRL's ``loss_type`` follows from it) and the KL weight."""

    loss_agg: str
    kl_coef: float

    @property
    def trl_loss_type(self) -> str:
        return TRL_LOSS_TYPE[self.loss_agg]

    @property
    def name(self) -> str:
        return f"{self.loss_agg}/{self.trl_loss_type}, kl {self.kl_coef:g}"


DEFAULT_SETTINGS = tuple(ExactSetting(agg, kl) for agg in TRL_LOSS_TYPE for kl in (0.0, 0.1))
"""Every aggregation TRL shares with memalpha, each with the KL term off and on."""


@dataclass(frozen=True)
class ExactBatchSpec:
    """The shared batch and the update settings both sides get.

    ``prompt_words`` gives each prompt's user turn its length (prompts of different lengths, so
    left padding and memalpha's shared-prefix path both act); ``response_lengths`` the responses'
    (random token ids; different lengths, so the aggregations differ); rows ``2i`` and ``2i+1``
    share prompt ``i`` (a group of 2). The old and reference log-probs are the policy's own
    shifted by Gaussian noise of ``old_noise`` and ``ref_noise`` (so many ratios leave the clip
    range and the KL term is not near zero).
    """

    prompt_words: tuple[int, ...] = (3, 9)
    response_lengths: tuple[int, ...] = (7, 3, 8, 5)
    max_completion_length: int = 8
    micro_batch_size: int = 2
    clip_low: float = 0.2
    clip_high: float = 0.28
    temperature: float = 0.9
    old_noise: float = 0.3
    ref_noise: float = 0.5
    lora_r: int = 4
    lora_alpha: int = 8
    lora_b_std: float = 0.2
    seed: int = 0


@dataclass
class ExactBatch:
    """The batch as memalpha holds it (lists of ids, per-row tensors) and the advantages."""

    prompts: list[list[int]]
    responses: list[list[int]]
    advantages: torch.Tensor
    old_logps: list[torch.Tensor]
    ref_logps: list[torch.Tensor]
    pad_id: int


@dataclass
class SideResult:
    """One side's numbers on the batch: per-token log-probs ``[B, T]`` (0 off the responses), the
    loss and the LoRA gradient by parameter name."""

    logps: torch.Tensor
    loss: float
    grads: dict[str, torch.Tensor] = field(default_factory=dict)


# ----------------------------------------------------------------------------- the shared batch


def chat_prompt_ids(tokenizer, words: int, index: int) -> list[int]:
    """A chat prompt (the same system turn, a user turn of ``words`` words) as token ids."""
    user = " ".join(f"fact{index}-{w}" for w in range(words))
    messages = [{"role": "system", "content": "You store facts."}, {"role": "user", "content": user}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def padded(rows: Sequence[torch.Tensor], width: int) -> torch.Tensor:
    """Per-row 1-D tensors right-padded with 0 into ``[B, width]``."""
    out = torch.zeros(len(rows), width, dtype=rows[0].dtype)
    for i, row in enumerate(rows):
        out[i, : row.numel()] = row
    return out


def response_mask(responses: Sequence[Sequence[int]], width: int) -> torch.Tensor:
    """``[B, width]`` 0/1 long mask of the response tokens (responses right-padded)."""
    lengths = torch.tensor([len(r) for r in responses])
    return (torch.arange(width)[None, :] < lengths[:, None]).long()


def scoring_spec(spec: ExactBatchSpec, pad_id: int):
    """memalpha's log-prob spec as ``GRPOModule`` builds it (temperature, micro-batch, pad id,
    shared prefixes)."""
    from memalpha.lm.logprobs.spec import LogprobSpec

    return LogprobSpec(temperature=spec.temperature, micro_batch_size=spec.micro_batch_size, pad_id=pad_id)


def build_batch(policy, tokenizer, spec: ExactBatchSpec) -> ExactBatch:
    """The batch both sides train on: prompts, random responses, advantages of drawn rewards
    (memalpha's :func:`~memalpha.grpo.advantages.group_advantages`) and the old/reference
    log-probs (the policy's own, from memalpha's scorer, plus noise)."""
    from memalpha.grpo.advantages import group_advantages
    from memalpha.lm.logprobs.per_token import token_logprobs

    generator = torch.Generator().manual_seed(spec.seed)
    prompt_rows = [chat_prompt_ids(tokenizer, words, i) for i, words in enumerate(spec.prompt_words)]
    prompts = [prompt_rows[row // 2] for row in range(len(spec.response_lengths))]
    vocab = len(tokenizer)
    responses = [torch.randint(0, vocab, (n,), generator=generator).tolist() for n in spec.response_lengths]
    rewards = torch.rand(len(responses), generator=generator, dtype=torch.float64)
    advantages = group_advantages(rewards, [row // 2 for row in range(len(responses))]).to(torch.float64)
    with torch.no_grad():
        current = token_logprobs(policy, prompts, responses, scoring_spec(spec, tokenizer.pad_token_id))

    def shifted(std: float) -> list[torch.Tensor]:
        noise = torch.randn(current.shape, generator=generator, dtype=torch.float64) * std
        return [(current[i, : len(r)] + noise[i, : len(r)]).detach().clone() for i, r in enumerate(responses)]

    return ExactBatch(prompts, responses, advantages, shifted(spec.old_noise), shifted(spec.ref_noise),
                      tokenizer.pad_token_id)


# ----------------------------------------------------------------------------- the policies


def load_memalpha_policy(model_dir: str, spec: ExactBatchSpec):
    """memalpha's LoRA policy (``load_policy``) in float64 with every LoRA B drawn, so the adapter matters."""
    from memalpha.lm.core.policy import LoraSettings, load_policy

    torch.manual_seed(spec.seed)
    lora = LoraSettings(r=spec.lora_r, alpha=spec.lora_alpha, dropout=0.0, target_modules="all-linear")
    policy, tokenizer = load_policy(model_dir, lora=lora)
    policy.to(torch.float64)
    generator = torch.Generator().manual_seed(spec.seed)
    with torch.no_grad():
        for name, parameter in policy.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0.0, spec.lora_b_std, generator=generator)
    return policy, tokenizer


def load_trl_model(model_dir: str, adapter_dir: str):
    """The same base weights through plain ``transformers``, the same adapter through ``peft``, float64."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64)
    return PeftModel.from_pretrained(base, adapter_dir, is_trainable=True)


def build_trl_trainer(model, tokenizer, setting: ExactSetting, spec: ExactBatchSpec, output_dir: str,
                      **overrides: Any):
    """A ``GRPOTrainer`` configured as memalpha's update: clip range, KL weight (no KL importance
    correction), loss type, micro-batches accumulated into one step, temperature, fp64 on the CPU.
    ``overrides`` replace ``GRPOConfig`` fields (the tests use them to break the match)."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    rows = len(spec.response_lengths)
    options: dict[str, Any] = {
        "output_dir": output_dir, "per_device_train_batch_size": spec.micro_batch_size,
        "gradient_accumulation_steps": rows // spec.micro_batch_size, "num_generations": 2,
        "max_completion_length": spec.max_completion_length, "temperature": spec.temperature,
        "beta": setting.kl_coef, "use_bias_correction_kl": False, "epsilon": spec.clip_low,
        "epsilon_high": spec.clip_high, "loss_type": setting.trl_loss_type, "scale_rewards": "group",
        "num_iterations": 1, "use_cpu": True, "bf16": False, "fp16": False, "report_to": "none",
        "save_strategy": "no", "disable_tqdm": True, "log_completions": False, "seed": spec.seed,
    }
    options.update(overrides)
    dataset = Dataset.from_list([{"prompt": "unused"}] * rows)
    return GRPOTrainer(
        model=model, reward_funcs=lambda completions, **kwargs: [0.0] * len(completions),
        args=GRPOConfig(**options), train_dataset=dataset, processing_class=tokenizer,
    )


# ----------------------------------------------------------------------------- TRL's inputs


def trl_inputs(batch: ExactBatch, kl: bool) -> dict[str, torch.Tensor]:
    """The whole batch as ``GRPOTrainer._generate_and_score_completions`` returns it: left-padded
    prompts, right-padded completions, their masks, advantages, old (and, with ``kl``, reference)
    per-token log-probs and ``num_items_in_batch`` (the batch's completion-token count)."""
    width = max(len(p) for p in batch.prompts)
    prompt_ids = torch.full((len(batch.prompts), width), batch.pad_id, dtype=torch.long)
    prompt_mask = torch.zeros_like(prompt_ids)
    for i, prompt in enumerate(batch.prompts):
        prompt_ids[i, width - len(prompt):] = torch.tensor(prompt)
        prompt_mask[i, width - len(prompt):] = 1
    columns = max(len(r) for r in batch.responses)
    completion_ids = padded([torch.tensor(r) for r in batch.responses], columns).masked_fill(
        response_mask(batch.responses, columns) == 0, batch.pad_id)
    completion_mask = response_mask(batch.responses, columns)
    inputs = {
        "prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
        "completion_mask": completion_mask, "advantages": batch.advantages.clone(),
        "old_per_token_logps": padded(batch.old_logps, columns),
        "num_items_in_batch": completion_mask.sum().to(torch.float64),
    }
    if kl:
        inputs["ref_per_token_logps"] = padded(batch.ref_logps, columns)
    return inputs


def micro_batches(inputs: dict[str, torch.Tensor], size: int) -> list[dict[str, torch.Tensor]]:
    """``inputs`` cut into rows of ``size`` (``num_items_in_batch`` stays the whole batch's, as in TRL)."""
    rows = inputs["prompt_ids"].shape[0]
    return [
        {key: value if key == "num_items_in_batch" else value[lo: lo + size] for key, value in inputs.items()}
        for lo in range(0, rows, size)
    ]


def lora_grads(model) -> dict[str, torch.Tensor]:
    """The trained LoRA parameters' gradients, by name (the same names in both PEFT models; the
    frozen ``ref`` copy of the adapter that TRL adds for its KL reference is left out)."""
    return {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.requires_grad}


# ----------------------------------------------------------------------------- the two sides


def memalpha_update_settings(setting: ExactSetting, spec: ExactBatchSpec):
    """memalpha's ``model.update`` for ``setting``."""
    from memalpha.grpo.settings import UpdateSettings

    return UpdateSettings(clip_low=spec.clip_low, clip_high=spec.clip_high, kl_coef=setting.kl_coef,
                          loss_agg=setting.loss_agg, micro_batch_size=spec.micro_batch_size)


def grpo_batch(batch: ExactBatch, kl: bool):
    """The batch as memalpha's :class:`~memalpha.grpo.batch.GRPOBatch`."""
    from memalpha.grpo.batch import GRPOBatch

    return GRPOBatch(prompt_ids=batch.prompts, response_ids=batch.responses, advantages=batch.advantages,
                     old_logps=batch.old_logps, ref_logps=batch.ref_logps if kl else None)


def run_memalpha(policy, batch: ExactBatch, setting: ExactSetting, spec: ExactBatchSpec) -> SideResult:
    """memalpha's log-probs, loss and LoRA gradient through the functions ``GRPOModule.training_step``
    calls."""
    from memalpha.grpo.update import accumulate_grpo_gradients
    from memalpha.lm.logprobs.per_token import micro_batch_scorer, token_logprobs

    logprob_spec = scoring_spec(spec, batch.pad_id)
    with torch.no_grad():
        logps = token_logprobs(policy, batch.prompts, batch.responses, logprob_spec)
    update = grpo_batch(batch, setting.kl_coef > 0)
    policy.zero_grad(set_to_none=True)
    metrics, finite = accumulate_grpo_gradients(
        micro_batch_scorer(policy, logprob_spec),
        update,
        memalpha_update_settings(setting, spec),
        max_response_len=spec.max_completion_length,
        token_normaliser=float(update.response_tokens),
        seq_normaliser=float(len(update)),
        backward=lambda loss: loss.backward(),
    )
    if not finite:
        raise RuntimeError("memalpha's loss is not finite on the exact-parity batch")
    mask = response_mask(batch.responses, logps.shape[1]).bool()
    return SideResult(torch.where(mask, logps, 0.0), metrics["loss"], lora_grads(policy))


def run_trl(trainer, batch: ExactBatch, setting: ExactSetting, spec: ExactBatchSpec) -> SideResult:
    """TRL's log-probs, loss and LoRA gradient: its own log-prob function on the whole batch, then
    its ``_compute_loss`` and one ``backward`` per micro-batch, as its training loop runs them."""
    model = trainer.model
    model.train()
    inputs = trl_inputs(batch, setting.kl_coef > 0)
    input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    with torch.no_grad():
        logps, _, _ = trainer._get_per_token_logps_and_entropies(
            model, input_ids, attention, inputs["completion_ids"].shape[1], batch_size=spec.micro_batch_size)
    parts = micro_batches(inputs, spec.micro_batch_size)
    trainer.current_gradient_accumulation_steps = len(parts)  # what Trainer's loop sets for each step
    model.zero_grad(set_to_none=True)
    loss = 0.0
    for part in parts:
        part_loss = trainer._compute_loss(model, part)
        part_loss.backward()
        loss += float(part_loss.detach())
    mask = inputs["completion_mask"].bool()
    return SideResult(torch.where(mask, logps.to(torch.float64), 0.0), loss, lora_grads(model))


def reference_logps(trainer, batch: ExactBatch, temperature: float,
                    positions: str = "generation") -> torch.Tensor:
    """A float64 yardstick for the log-probs: TRL's model through its original (unfused) forward,
    the full logits divided by the temperature, a float64 log-softmax. ``positions``:
    ``generation`` numbers each row from its first real token (``cumsum(mask) - 1``, as
    ``generate`` and memalpha do); ``trl`` passes none, as TRL's training forward does, so a
    left-padded row is numbered from its first pad column."""
    inputs = trl_inputs(batch, kl=False)
    input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    position_ids = (attention.cumsum(-1) - 1).clamp(min=0) if positions == "generation" else None
    columns = inputs["completion_ids"].shape[1]
    with torch.no_grad():
        logits = trainer.model(input_ids=input_ids, attention_mask=attention, position_ids=position_ids)
    logits = logits.logits
    scores = torch.log_softmax(logits.to(torch.float64)[:, -columns - 1: -1] / temperature, dim=-1)
    picked = scores.gather(2, inputs["completion_ids"].unsqueeze(2)).squeeze(2)
    return torch.where(inputs["completion_mask"].bool(), picked, 0.0)


# ----------------------------------------------------------------------------- the same log-probs


def same_logps_memalpha(logps: torch.Tensor, batch: ExactBatch, setting: ExactSetting,
                        spec: ExactBatchSpec) -> tuple[float, torch.Tensor]:
    """memalpha's loss of the given ``[B, T]`` log-probs and its gradient with respect to them:
    :func:`~memalpha.grpo.update.micro_batch_loss` per micro-batch with the mini-batch normalisers."""
    from memalpha.grpo.update import micro_batch_loss

    leaf = logps.detach().clone().requires_grad_(True)
    update = grpo_batch(batch, setting.kl_coef > 0)
    settings = memalpha_update_settings(setting, spec)
    total = 0.0
    for lo in range(0, len(update), spec.micro_batch_size):
        rows = list(range(lo, min(lo + spec.micro_batch_size, len(update))))
        out = micro_batch_loss(
            leaf[rows], None, update.select(rows), settings, token_normaliser=float(update.response_tokens),
            seq_normaliser=float(len(update)), max_response_len=spec.max_completion_length,
        )
        out.loss.backward()
        total += float(out.loss.detach())
    return total, leaf.grad


def same_logps_trl(trainer, logps: torch.Tensor, batch: ExactBatch, setting: ExactSetting,
                   spec: ExactBatchSpec) -> tuple[float, torch.Tensor]:
    """TRL's ``_compute_loss`` of the given log-probs: its log-prob function is replaced on the
    instance by one that returns the rows of ``logps`` the micro-batch holds; all else is TRL's."""
    leaf = logps.detach().clone().requires_grad_(True)
    inputs = trl_inputs(batch, setting.kl_coef > 0)
    inputs["rows"] = torch.arange(leaf.shape[0])
    parts = micro_batches(inputs, spec.micro_batch_size)
    trainer.current_gradient_accumulation_steps = len(parts)
    trainer.model.train()
    own = trainer._get_per_token_logps_and_entropies
    total = 0.0
    try:
        for part in parts:
            rows = part.pop("rows")
            trainer._get_per_token_logps_and_entropies = _fixed_logps(leaf[rows])
            part_loss = trainer._compute_loss(trainer.model, part)
            part_loss.backward()
            total += float(part_loss.detach())
    finally:
        trainer._get_per_token_logps_and_entropies = own
    return total, leaf.grad


def _fixed_logps(rows: torch.Tensor) -> Callable[..., tuple[torch.Tensor, torch.Tensor, None]]:
    """A stand-in for TRL's log-prob function: ``rows`` as the log-probs, zero entropies, no aux loss."""

    def per_token(model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        return rows, torch.zeros_like(rows.detach()), None

    return per_token


# ----------------------------------------------------------------------------- the comparison


def grad_differences(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]) -> dict[str, float]:
    """Both gradients' norms, the largest absolute entry difference and that over TRL's largest entry."""
    if set(ours) != set(theirs) or not ours:
        raise ValueError(f"the sides' LoRA parameters differ: {sorted(set(ours) ^ set(theirs))[:4]}")
    norm = {side: math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads.values()))
            for side, grads in (("memalpha", ours), ("trl", theirs))}
    diff = max(float((ours[k].double() - theirs[k].double()).abs().max()) for k in ours)
    largest = max(float(g.double().abs().max()) for g in theirs.values())
    return {"grad_norm_memalpha": norm["memalpha"], "grad_norm_trl": norm["trl"], "grad_max_abs_diff": diff,
            "grad_max_abs_rel": diff / largest if largest else diff}


def within(row: dict[str, float]) -> dict[str, bool]:
    """Each difference of a setting's row against its :data:`TOLERANCES` bound."""
    measured = {
        "logprob_memalpha_vs_fp64": row["logprob_memalpha_vs_fp64"],
        "logprob_max_abs": row["logprob_max_abs_diff"],
        "loss_abs": row["loss_abs_diff"],
        "grad_max_abs_rel": row["grad_max_abs_rel"],
        "same_logps_loss_abs": row["same_logps_loss_abs_diff"],
        "same_logps_grad_max_abs": row["same_logps_grad_max_abs_diff"],
    }
    return {key: value <= TOLERANCES[key] for key, value in measured.items()}


def compare_setting(policy, trainer, batch: ExactBatch, setting: ExactSetting, spec: ExactBatchSpec) -> dict:
    """One setting's row: both sides end to end, then both losses on the same float64 log-probs."""
    ours = run_memalpha(policy, batch, setting, spec)
    theirs = run_trl(trainer, batch, setting, spec)
    loss_m, grad_m = same_logps_memalpha(ours.logps, batch, setting, spec)
    loss_t, grad_t = same_logps_trl(trainer, ours.logps, batch, setting, spec)
    yardstick = reference_logps(trainer, batch, spec.temperature)
    trl_positions = reference_logps(trainer, batch, spec.temperature, positions="trl")
    row = {
        "loss_agg": setting.loss_agg, "trl_loss_type": setting.trl_loss_type, "kl_coef": setting.kl_coef,
        "logprob_max_abs_diff": float((ours.logps - theirs.logps).abs().max()),
        "logprob_memalpha_vs_fp64": float((ours.logps - yardstick).abs().max()),
        "logprob_trl_vs_fp64_own_positions": float((theirs.logps - trl_positions).abs().max()),
        "logprob_position_numbering_effect": float((yardstick - trl_positions).abs().max()),
        "loss_memalpha": ours.loss, "loss_trl": theirs.loss, "loss_abs_diff": abs(ours.loss - theirs.loss),
        **grad_differences(ours.grads, theirs.grads),
        "same_logps_loss_memalpha": loss_m, "same_logps_loss_trl": loss_t,
        "same_logps_loss_abs_diff": abs(loss_m - loss_t),
        "same_logps_grad_max_abs_diff": float((grad_m - grad_t).abs().max()),
    }
    row["within_tolerance"] = within(row)
    row["passed"] = all(row["within_tolerance"].values())
    return row


@dataclass
class ExactRig:
    """The shared pieces of a comparison: the tiny model's folder, memalpha's policy, the saved
    adapter TRL loads, the tokenizer, the batch and a scratch folder for TRL's output."""

    model_dir: str
    adapter_dir: str
    policy: Any
    tokenizer: Any
    batch: ExactBatch
    spec: ExactBatchSpec
    scratch: str

    def trainer(self, setting: ExactSetting, spec: ExactBatchSpec | None = None, **overrides: Any):
        """A fresh TRL model (the same weights) inside a fresh ``GRPOTrainer`` for ``setting``
        (``spec``: other update settings than the rig's; ``overrides``: ``GRPOConfig`` fields)."""
        model = load_trl_model(self.model_dir, self.adapter_dir)
        return build_trl_trainer(model, self.tokenizer, setting, spec or self.spec, self.scratch, **overrides)

    def compare(self, setting: ExactSetting, spec: ExactBatchSpec | None = None, **overrides: Any) -> dict:
        """:func:`compare_setting` for ``setting`` (``spec`` and ``overrides`` as for :meth:`trainer`;
        the tests use them to break the match on purpose)."""
        spec = spec or self.spec
        trainer = self.trainer(setting, spec, **overrides)
        return compare_setting(self.policy, trainer, self.batch, setting, spec)

    def memalpha_logps(self) -> torch.Tensor:
        """memalpha's float64 log-probs of the batch, ``[B, T]``, 0 off the responses."""
        from memalpha.lm.logprobs.per_token import token_logprobs

        with torch.no_grad():
            logps = token_logprobs(self.policy, self.batch.prompts, self.batch.responses,
                                   scoring_spec(self.spec, self.batch.pad_id))
        return torch.where(response_mask(self.batch.responses, logps.shape[1]).bool(), logps, 0.0)


def build_rig(workdir: str | Path, spec: ExactBatchSpec = ExactBatchSpec(),
              tokenizer: Any = None) -> ExactRig:
    """Save the tiny random Llama (the embedded tokenizer) and memalpha's drawn adapter under
    ``workdir``, load memalpha's policy and build the batch."""
    from memalpha_lab.common import tiny_model_folder

    workdir = Path(workdir)
    model_dir = tiny_model_folder(workdir / "model", tokenizer=tokenizer, seed=spec.seed,
                                  initializer_range=0.3)
    policy, tokenizer = load_memalpha_policy(model_dir, spec)
    adapter_dir = str(workdir / "adapter")
    policy.save_pretrained(adapter_dir)
    batch = build_batch(policy, tokenizer, spec)
    scratch = workdir / "trl"
    scratch.mkdir(exist_ok=True)
    return ExactRig(model_dir, adapter_dir, policy, tokenizer, batch, spec, str(scratch))


def run_all(settings: Sequence[ExactSetting] = DEFAULT_SETTINGS, spec: ExactBatchSpec = ExactBatchSpec(),
            workdir: str | Path | None = None) -> dict[str, Any]:
    """Every setting's row on one batch, with the spec, the tolerances and whether all passed."""
    with tempfile.TemporaryDirectory(prefix="trl_exact_") as scratch:
        rig = build_rig(workdir or scratch, spec)
        rows = [{"setting": s.name, **rig.compare(s)} for s in settings]
    return {"spec": asdict(spec), "tolerances": dict(TOLERANCES), "settings": rows,
            "passed": all(row["passed"] for row in rows), "batch_tokens": sum(spec.response_lengths)}


def with_spec(spec: ExactBatchSpec, **changes: Any) -> ExactBatchSpec:
    """``spec`` with ``changes`` (a convenience for tests and the command line)."""
    return replace(spec, **changes)


TABLE_HEADERS = (
    "memalpha agg / TRL loss_type, kl", "logp diff", "ours vs fp64", "TRL vs fp64", "loss memalpha",
    "loss diff", "grad norm", "grad diff (rel)", "same-logp loss diff", "same-logp grad diff", "ok",
)

NOTES = (
    "one batch, no training: memalpha's update path and TRL's GRPOTrainer loss on the same prompts, "
    "responses, advantages, old and reference log-probs and LoRA weights (float64 model); "
    "'vs fp64': against a float64 log-softmax of the full logits (TRL's at its own position numbering); "
    "'same-logp': both losses on memalpha's float64 log-probs; see experiments/lab/memalpha_lab/trl_exact.py"
)


def _sci(value: float) -> str:
    return f"{value:.1e}"


def table_rows(report: Mapping[str, Any]) -> list[list[Any]]:
    """One table row per setting of a :func:`run_all` report (differences in scientific notation)."""
    return [
        [
            row["setting"], _sci(row["logprob_max_abs_diff"]), _sci(row["logprob_memalpha_vs_fp64"]),
            _sci(row["logprob_trl_vs_fp64_own_positions"]), f"{row['loss_memalpha']:.6f}",
            _sci(row["loss_abs_diff"]), f"{row['grad_norm_memalpha']:.4f}", _sci(row["grad_max_abs_rel"]),
            _sci(row["same_logps_loss_abs_diff"]), _sci(row["same_logps_grad_max_abs_diff"]),
            "yes" if row["passed"] else "NO",
        ]
        for row in report["settings"]
    ]


def check(
    out: Path, extra: Mapping[str, Any], compare: Callable[[], dict[str, Any]] = run_all
) -> dict[str, Any]:
    """``bench_vs_trl.py --exact``: the comparison (``compare``, :func:`run_all`), its table on
    stdout and its report with ``extra`` written to ``out``; returns the report, or exits with 1
    when a setting is outside its tolerance."""
    machine = machine_info()
    report = compare()
    report.update(extra, notes=NOTES)
    print_table(TABLE_HEADERS, table_rows(report))
    tolerances = ", ".join(f"{key} {value:g}" for key, value in report["tolerances"].items())
    print(f"tolerances: {tolerances}")
    print("all settings within tolerance" if report["passed"] else "SOME SETTINGS OUTSIDE TOLERANCE")
    path = write_json(report, out, machine=machine)
    print(f"wrote {path}")
    if not report["passed"]:
        raise SystemExit(1)
    return report
