"""What ``configs/qlora_4090.yaml`` runs, without downloads: Qwen3-4B's shape (scaled down with
its structure kept, for a CPU) as a random-weight model, the 24 GiB the recipe must fit in, and
the recipe's step-shaping values. ``experiments/bench/bench_scale.py`` (one GRPO step) and
``experiments/gpu/gpu_fit_check.py`` (``memalpha fit`` for two steps) share them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from memalpha.lm.core.policy import LMSettings, LoraSettings
from memalpha_lab.common import REPO_ROOT

CONFIG_PATH = REPO_ROOT / "configs" / "qlora_4090.yaml"
GPU_CAP_BYTES = 24 * 2**30
"""The memory a run of the recipe is capped to (an RTX 4090's)."""

QWEN3_4B = {
    "vocab_size": 151936,
    "hidden_size": 2560,
    "intermediate_size": 9728,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "attention_bias": False,
    "hidden_act": "silu",
}
"""Qwen3-4B's published configuration (the values that set memory and time)."""


def read_recipe(path: Path = CONFIG_PATH) -> dict[str, Any]:
    """The step-shaping values of ``configs/qlora_4090.yaml``."""
    config = yaml.safe_load(path.read_text(encoding="utf-8"))
    model = config["model"]
    rollout, lora, lm = model["rollout"], model["lora"], model["lm"]
    update, optimizer = model["update"], model["optimizer"]
    return {
        "group_size": int(rollout["group_size"]),
        "prompt_tokens": int(rollout["max_prompt_tokens"]),
        "response_tokens": int(rollout["max_new_tokens"]),
        "generation_batch_size": int(rollout.get("generation_batch_size") or rollout["group_size"]),
        "temperature": float(rollout["temperature"]),
        "micro_batch_size": int(update["micro_batch_size"]),
        "lora": LoraSettings(r=int(lora["r"]), alpha=int(lora["alpha"]), dropout=float(lora["dropout"]),
                             target_modules=lora["target_modules"]),
        "compute_dtype": lm["compute_dtype"],
        "upcast_unquantised": bool(lm.get("upcast_unquantised", LMSettings.upcast_unquantised)),
        "gradient_checkpointing": bool(lm["gradient_checkpointing"]),
        "backend": rollout.get("backend", "auto"),
        "optimizer": optimizer["name"],
        "learning_rate": float(optimizer["learning_rate"]),
        "weight_decay": float(optimizer["weight_decay"]),
        "grad_clip": float(optimizer["grad_clip"]),
        "kl_coef": float(update["kl_coef"]),
        "clip_low": float(update["clip_low"]),
        "clip_high": float(update["clip_high"]),
    }


def scaled_shape(scale: float, vocab_size: int | None = None) -> dict[str, Any]:
    """Qwen3-4B's config values with layers, widths and head counts times ``scale`` (GQA ratio kept)."""
    if not 0 < scale <= 1:
        raise ValueError(f"scale must be in (0, 1], got {scale}")
    shape = dict(QWEN3_4B)
    ratio = QWEN3_4B["num_attention_heads"] // QWEN3_4B["num_key_value_heads"]
    kv_heads = max(1, round(QWEN3_4B["num_key_value_heads"] * scale))
    shape.update(
        num_hidden_layers=max(1, round(QWEN3_4B["num_hidden_layers"] * scale)),
        hidden_size=64 * max(1, round(QWEN3_4B["hidden_size"] * scale / 64)),
        intermediate_size=64 * max(1, round(QWEN3_4B["intermediate_size"] * scale / 64)),
        num_key_value_heads=kv_heads,
        num_attention_heads=kv_heads * ratio,
    )
    if vocab_size is not None:
        shape["vocab_size"] = vocab_size
    return shape


def build_random_model_dir(path: str | os.PathLike, shape: dict[str, Any], tokenizer, seed: int = 0) -> int:
    """Save a random-weight Qwen3 of ``shape`` (bf16) with ``tokenizer`` into ``path``; returns its
    parameter count."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        **shape,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        model = Qwen3ForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    count = sum(p.numel() for p in model.parameters())
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    del model
    return count
