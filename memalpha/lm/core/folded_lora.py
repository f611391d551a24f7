"""Sampling with the LoRA update folded into a temporary copy of each adapted weight.

A PEFT LoRA linear layer computes ``x W^T + s (x A^T) B^T``: besides the base product, two thin
products, a scaling and an addition per adapted layer. At one token per row they are all
overhead: ~15 % of a decoding step of the embedded model with every linear layer adapted, on
2 CPU cores. Inside :func:`folded_adapters` each such layer instead runs one ``F.linear`` with
``W + s B A``, computed once when the block starts; :func:`effective_weight` gives the same
weights to memalpha's own decoding step (:mod:`memalpha.lm.sampling.fused_decode`).

The base weights are never written: PEFT's own ``merge()``/``unmerge()`` adds and then
subtracts the update in place, which leaves float rounding in the frozen base after every
round (and the base is also the KL reference and the reader). The cost is a copy of every
adapted weight for the duration of the block, so it is a setting
(``lm.fold_adapters_for_sampling``) that a user short of memory turns off; 4-bit bases and
LoRA variants (DoRA, a LoRA bias) keep their own forward.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial

import torch
import torch.nn.functional as F


def plain_adapters(module) -> list[str] | None:
    """The active adapters of a PEFT LoRA ``Linear`` over a float ``torch.nn.Linear`` when all of
    them are plain LoRA (no variant, no bias); None when the layer cannot be folded."""
    try:
        from peft.tuners.lora.layer import Linear as LoraLinear
    except ImportError:  # no PEFT installed: nothing to fold
        return None
    if type(module) is not LoraLinear or module.disable_adapters or module.merged:
        return None
    base = module.get_base_layer()
    if type(base) is not torch.nn.Linear or not base.weight.is_floating_point():
        return None
    active = [name for name in module.active_adapters if name in module.lora_A]
    if not active:
        return None
    for name in active:
        if name in getattr(module, "lora_variant", {}) or module.use_dora.get(name, False):
            return None
        if module.lora_bias.get(name, False):
            return None
    return active


def folded_weight(module, adapters: list[str], out: torch.Tensor | None = None) -> torch.Tensor:
    """``W + sum_a s_a B_a A_a`` of a PEFT LoRA linear layer in ``W``'s dtype, written into ``out``
    (a new tensor when None). Adapters in ``W``'s dtype are added by one ``addmm`` each, without
    a temporary of the weight's size; others through PEFT's ``get_delta_weight``."""
    base = module.get_base_layer().weight.detach()
    weight = torch.empty_like(base) if out is None else out
    weight.copy_(base)
    for name in adapters:
        a, b = module.lora_A[name].weight.detach(), module.lora_B[name].weight.detach()
        if not module.fan_in_fan_out and a.dtype == b.dtype == weight.dtype:
            weight.addmm_(b, a, alpha=module.scaling[name])
        else:
            weight += module.get_delta_weight(name).detach().to(weight.dtype)
    return weight


def effective_weight(module, out: torch.Tensor | None = None) -> torch.Tensor | None:
    """The weight ``module`` applies, adapters included: a ``torch.nn.Linear``'s own weight, a
    PEFT LoRA layer's base weight while its adapters are off (or merged), its folded weight while
    plain adapters are on; None for anything else (4-bit layers, DoRA, a LoRA bias, other types).
    With ``out`` the weight is written there (and ``out`` returned) instead of being returned
    as the module's own tensor or a new one."""
    adapters = plain_adapters(module)
    if adapters is not None:
        return folded_weight(module, adapters, out)
    weight = _own_weight(module)
    if weight is None or out is None:
        return weight
    return out.copy_(weight)


def _own_weight(module) -> torch.Tensor | None:
    """The weight of a ``torch.nn.Linear``, or of a PEFT LoRA layer whose adapters are off."""
    if type(module) is torch.nn.Linear:
        return module.weight.detach()
    try:
        from peft.tuners.lora.layer import Linear as LoraLinear
    except ImportError:
        return None
    if type(module) is LoraLinear:
        base = module.get_base_layer()
        idle = module.disable_adapters or module.merged or not any(a in module.lora_A for a in module.active_adapters)
        if idle and type(base) is torch.nn.Linear and base.weight.is_floating_point():
            return base.weight.detach()
    return None


@contextmanager
def folded_adapters(model, enabled: bool = True) -> Iterator[int]:
    """Run every foldable LoRA layer of ``model`` as a single linear layer inside the block.

    Yields the number of layers folded (0 when ``enabled`` is False, when the adapters are
    disabled -- e.g. under ``model.disable_adapter()`` -- or when none qualifies). For
    inference only: the folded weights carry no gradient to the adapter. The layers' own
    forwards are back when the block ends, also on an exception.
    """
    folded: list[torch.nn.Module] = []
    try:
        if enabled:
            with torch.no_grad():
                for module in model.modules():
                    adapters = plain_adapters(module)
                    if adapters is None:
                        continue
                    bias = module.get_base_layer().bias
                    module.forward = partial(F.linear, weight=folded_weight(module, adapters), bias=bias)
                    folded.append(module)
        yield len(folded)
    finally:
        for module in folded:
            del module.forward  # the instance attribute; the class's forward shows again
