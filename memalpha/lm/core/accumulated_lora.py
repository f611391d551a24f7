"""Scoring through PEFT LoRA layers with each adapter's product added into the base output.

PEFT's LoRA ``Linear`` computes ``base(x) + lora_B(lora_A(x)) * s``: after the thin products it
scales the adapter's output and adds it to the base output, two passes over a ``[tokens, out]``
tensor, and a third (the scaling's gradient) in backward: on the CPU with a small model, a
visible share of an update. Inside :func:`accumulated_adapters` each plain LoRA layer instead
adds ``s (x A^T) B^T`` into its base output in place, by one ``addmm_`` whose ``alpha`` is the
scaling: the same value up to float rounding, the same gradients (``addmm_``'s backward scales
only the thin ``[tokens, r]`` and ``[r, out]`` products), and no weight is copied or written.

Layers PEFT runs some other way keep their own forward: DoRA and other variants, a LoRA bias,
4-bit or non-linear bases, adapters in another dtype than the base (PEFT upcasts adapters of a
half-precision base), ``fan_in_fan_out`` weights, and calls with extra arguments.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial

import torch
import torch.nn.functional as F

from memalpha.lm.core.folded_lora import plain_adapters


def _accumulating_forward(module, adapters: list[str], x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """``module``'s output with every adapter's product added into the base output in place."""
    base = module.get_base_layer()
    loras = [(module.lora_A[name], module.lora_B[name], module.lora_dropout[name], module.scaling[name])
             for name in adapters]
    if (
        args or kwargs or module.disable_adapters or module.merged or module.fan_in_fan_out
        or any(a.weight.dtype != x.dtype or b.weight.dtype != x.dtype for a, b, _, _ in loras)
        or base.weight.dtype != x.dtype
    ):
        return type(module).forward(module, x, *args, **kwargs)
    flat = x.reshape(-1, x.shape[-1])
    out = F.linear(flat, base.weight, base.bias)  # its backward keeps x and W, not out: out may change
    for a, b, dropout, scaling in loras:
        out.addmm_(F.linear(dropout(flat), a.weight), b.weight.t(), alpha=scaling)
    return out.view(*x.shape[:-1], out.shape[-1])


@contextmanager
def accumulated_adapters(model) -> Iterator[int]:
    """Run every plain LoRA layer of ``model`` with :func:`_accumulating_forward` inside the block.

    Yields the number of layers switched (0 when the adapters are disabled, e.g. under
    ``model.disable_adapter()``, when none qualifies, or when the model uses gradient
    checkpointing, whose recomputation in backward runs after the block). Gradients flow as
    through PEFT's forward. The layers' own forwards are back when the block ends, also on an
    exception.
    """
    switched: list[torch.nn.Module] = []
    # a checkpointed layer reruns its forward during backward, outside the block: it must run the same way
    checkpointed = any(getattr(module, "gradient_checkpointing", False) for module in model.modules())
    try:
        for module in [] if checkpointed else model.modules():
            adapters = plain_adapters(module)
            if adapters is None or "forward" in module.__dict__:  # already switched (folded, or by a caller)
                continue
            module.forward = partial(_accumulating_forward, module, adapters)
            switched.append(module)
        yield len(switched)
    finally:
        for module in switched:
            del module.forward
