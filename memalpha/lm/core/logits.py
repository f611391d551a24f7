"""What a causal LM's head output becomes before sampling or scoring: the dtype the numbers are
computed in, and the architecture's own transforms after the head (logit scale, soft-capping)."""

from __future__ import annotations

import torch


def score_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype log-probs are computed in: float32, or float64 for a float64 model (exact comparisons)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def finalise_logits(logits: torch.Tensor, config) -> torch.Tensor:
    """Architecture-specific logit transforms that ``*ForCausalLM.forward`` applies after the head."""
    scale = getattr(config, "logit_scale", None)
    if scale is not None:
        logits = logits * scale
    cap = getattr(config, "final_logit_softcapping", None)
    if cap is not None:
        logits = torch.tanh(logits / cap) * cap
    return logits
