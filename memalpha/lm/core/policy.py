"""The policy: one causal LM (fp32, bf16 or 4-bit NF4) with a LoRA adapter.

The reference policy and the local reader are the same weights with the adapter switched
off (``with model.disable_adapter(): ...``), or for the reference a frozen second adapter
(:mod:`memalpha.lm.core.modes`); no second copy of the base model is ever loaded. Sampling lives in
:mod:`memalpha.lm.sampling.generation` and per-token log-probs in :mod:`memalpha.lm.logprobs.per_token`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

import torch

from memalpha.lm.core.attention import use_bounded_attention
from memalpha.lm.core.embedded import load_tokenizer, resolve_model_path
from memalpha.lm.core.nf4_cpu_packing import keep_nf4_layers_unpacked

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


@dataclass
class LoraSettings:
    """LoRA adapter shape.

    Args:
        r: rank of the update matrices.
        alpha: scaling numerator (the update is scaled by ``alpha / r``).
        dropout: dropout on the adapter input.
        target_modules: module names to adapt, or ``"all-linear"`` for every linear layer
            except the output head.
    """

    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: str | list[str] = field(default="all-linear")

    def __post_init__(self) -> None:
        if self.r < 1:
            raise ValueError(f"lora.r must be >= 1, got {self.r}")
        if self.alpha <= 0:
            raise ValueError(f"lora.alpha must be > 0, got {self.alpha}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"lora.dropout must be in [0, 1), got {self.dropout}")
        if not self.target_modules:
            raise ValueError("lora.target_modules must name at least one module (or be 'all-linear')")

    def to_peft(self):
        from peft import LoraConfig

        return LoraConfig(
            r=self.r,
            lora_alpha=self.alpha,
            lora_dropout=self.dropout,
            target_modules=self.target_modules,
            bias="none",
            task_type="CAUSAL_LM",
        )


DEFAULT_LORA = LoraSettings()

Precision = Literal["fp32", "bf16", "nf4"]
PRECISIONS: tuple[str, ...] = get_args(Precision)
ComputeDtype = Literal["float32", "bfloat16", "float16"]
COMPUTE_DTYPES: tuple[str, ...] = get_args(ComputeDtype)


@dataclass
class LMSettings:
    """How the policy's base model is loaded and run.

    Args:
        precision: Base weights as ``fp32``, ``bf16`` or 4-bit ``nf4`` (QLoRA through bitsandbytes).
        compute_dtype: Compute dtype of the NF4 layers (``bfloat16`` on GPUs, ``float32`` on CPU).
            On the CPU the policy's NF4 layers always dequantise and multiply, in sampling too:
            bitsandbytes' faster CPU inference kernel has no backward and would corrupt the
            LoRA gradients (``memalpha/lm/core/nf4_cpu_packing.py``).
        gradient_checkpointing: Recompute activations in backward to save memory (about one more
            forward pass of time). Without it the policy pass computes the prompt prefix that a
            mini-batch shares (the system prompt) once; with it, once per sequence.
        share_prefix: Compute the prompt tokens that rows of a batch share once and reuse their
            key/value cache: the system prompt every turn starts with, and prompts a group repeats
            (generation, reference and policy passes). Off runs every row in full; the results agree
            up to float rounding, so this is only for comparisons.
        upcast_unquantised: With ``precision: nf4``, keep the weights bitsandbytes does not
            quantise (embedding, norms, output head) in float32, as PEFT's
            ``prepare_model_for_kbit_training`` does: the residual stream, attention and the
            key/value cache then run in float32 too (for Qwen3-4B a cache of 8 rows x 8192 tokens
            takes ~19 GB instead of ~9.6 GB in bf16, and CUDA's flash attention takes no float32).
            Off keeps them in ``compute_dtype``, as the 4-bit layers compute; the head's logits are
            then rounded to that dtype before memalpha turns them into float32 log-probs.
        attention_score_mib: The most memory, in MiB, that one block of attention scores may take
            where no fused attention kernel takes the inputs and PyTorch's math kernel runs (then
            queries run in blocks of this size; ``memalpha/lm/core/attention.py``). Fused kernels
            never hold the scores, so this only bounds that fallback.
    """

    precision: Precision = "fp32"
    compute_dtype: ComputeDtype = "bfloat16"
    gradient_checkpointing: bool = False
    share_prefix: bool = True
    upcast_unquantised: bool = True
    attention_score_mib: int = 256

    def __post_init__(self) -> None:
        if self.attention_score_mib < 1:
            raise ValueError(f"lm.attention_score_mib must be >= 1, got {self.attention_score_mib}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"lm.precision must be one of {list(PRECISIONS)}, got {self.precision!r}")
        if self.compute_dtype not in COMPUTE_DTYPES:
            raise ValueError(
                f"lm.compute_dtype must be one of {list(COMPUTE_DTYPES)}, got {self.compute_dtype!r}"
            )


def _dtype(name: str, what: str) -> torch.dtype:
    try:
        return _DTYPES[name]
    except KeyError:
        raise ValueError(f"{what} must be one of {sorted(_DTYPES)}, got {name!r}") from None


def _enable_checkpointing(model) -> None:
    """Activation checkpointing that still yields adapter gradients under PEFT.

    The base weights are frozen, so the embedding output does not require grad; a
    checkpointed block whose inputs need no grad would hand back no gradients at all (the
    classic PEFT pitfall). ``enable_input_require_grads`` marks the embedding output as
    requiring grad, which fixes it for both checkpoint implementations.
    """
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:  # transformers < 5
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    if (
        not getattr(model, "_require_grads_hooks", None)
        and getattr(model, "_require_grads_hook", None) is None
    ):
        model.enable_input_require_grads()
    model.config.use_cache = False


def load_policy(
    model: str,
    precision: str = "fp32",
    lora: LoraSettings | None = DEFAULT_LORA,
    compute_dtype: str = "bfloat16",
    gradient_checkpointing: bool = False,
    adapter_path: str | None = None,
    device: str | torch.device = "cpu",
    attention_score_mib: int = 256,
    upcast_unquantised: bool = True,
):
    """Load a causal LM and wrap it with a trainable LoRA adapter.

    Args:
        model: embedded name (``smollm2-135m-instruct``), local folder or hub id.
        precision: ``fp32``, ``bf16`` or ``nf4`` (bitsandbytes 4-bit NormalFloat; with
            ``upcast_unquantised`` the model is prepared with ``prepare_model_for_kbit_training``:
            embedding, norms and head in fp32; without, they stay in ``compute_dtype``; base frozen;
            with an adapter, its 4-bit layers never take bitsandbytes' CPU inference kernel, which
            has no backward, see :mod:`memalpha.lm.core.nf4_cpu_packing`).
        lora: adapter shape for a fresh adapter; None with no ``adapter_path`` returns the bare
            model in eval mode (an inference-only reader).
        compute_dtype: matmul dtype of the 4-bit layers (``nf4`` only).
        gradient_checkpointing: recompute activations in backward (works with the frozen base).
        adapter_path: folder written by ``save_pretrained`` of a previous adapter; it is loaded
            trainable and ``lora`` is ignored.
        device: where the model lives.
        upcast_unquantised: see :class:`LMSettings` (``nf4`` only).
        attention_score_mib: bound on one block of attention scores where only PyTorch's math
            kernel takes the inputs (:func:`memalpha.lm.core.attention.use_bounded_attention`; models
            loaded with ``sdpa``, the default, switch to memalpha's attention).

    Returns:
        ``(model, tokenizer)``; the model is a ``peft.PeftModel`` in train mode whose only
        trainable parameters are the adapter's, and the tokenizer pads on the left.
    """
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    path = resolve_model_path(model)
    tokenizer = load_tokenizer(path)
    device = torch.device(device)
    if precision == "nf4":
        quantization = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,  # the 4-bit quantisation constants are quantised too
            bnb_4bit_compute_dtype=_dtype(compute_dtype, "compute_dtype"),
        )
        base = AutoModelForCausalLM.from_pretrained(
            path, quantization_config=quantization, dtype=_dtype(compute_dtype, "compute_dtype"),
            device_map={"": device},
        )
    else:
        base = AutoModelForCausalLM.from_pretrained(path, dtype=_dtype(precision, "precision")).to(device)
    use_bounded_attention(base, score_budget=attention_score_mib * 2**20)
    if base.generation_config.pad_token_id is None and tokenizer.pad_token_id is not None:
        base.generation_config.pad_token_id = tokenizer.pad_token_id
    if base.generation_config.eos_token_id is None and tokenizer.eos_token_id is not None:
        base.generation_config.eos_token_id = tokenizer.eos_token_id

    for parameter in base.parameters():
        parameter.requires_grad_(False)
    if lora is None and adapter_path is None:
        return base.eval(), tokenizer
    if precision == "nf4":
        from peft import prepare_model_for_kbit_training

        keep_nf4_layers_unpacked(base)  # trained through: no backward-less CPU inference kernel
        if upcast_unquantised:  # (the base is frozen above either way)
            base = prepare_model_for_kbit_training(base, use_gradient_checkpointing=False)
    if gradient_checkpointing:
        _enable_checkpointing(base)

    from peft import PeftModel, get_peft_model

    if adapter_path is not None:
        policy = PeftModel.from_pretrained(base, adapter_path, is_trainable=True)
    else:
        policy = get_peft_model(base, lora.to_peft())
    policy.train()
    return policy, tokenizer
