"""How the policy runs for a block: the context managers that switch it and switch it back,
however the block ends.

**Eval mode** (:func:`eval_mode`, sampling and scoring): dropout off for the block, the caller's
mode back after it.

**Folded (sampling).** A PEFT LoRA linear layer computes ``x W^T + s (x A^T) B^T``: besides the base
product, two thin products, a scaling and an addition per adapted layer, all overhead at one token
per row. Inside :func:`folded_adapters` each such layer instead runs one ``F.linear`` with
``W + s B A``, computed once when the block starts; :func:`effective_weight` gives the same weights to
memalpha's own decoding step (:mod:`memalpha.lm.sampling.fused_decode`).

The base weights are never written: PEFT's own ``merge()``/``unmerge()`` adds and then
subtracts the update in place, which leaves float rounding in the frozen base after every
round (and the base is also the KL reference and the reader). The cost is a copy of every
adapted weight for the duration of the block, which a user short of memory avoids by naming an
unfolded backend (``rollout.backend: hf-generate``); LoRA variants
(DoRA, a LoRA bias) keep their own forward.

4-bit bases (bitsandbytes ``Linear4bit``) are folded only when asked (``quantised=True``): their
copy is dequantised, in the layer's compute dtype, and so four times the size of the weight it
replaces. That is what a CUDA-graph sampler wants (:mod:`memalpha.lm.sampling.graph_decode`): a
decoding step that reads plain bf16 weights instead of dequantising every NF4 weight at every token.

**Accumulated (scoring).** PEFT's LoRA ``Linear`` computes ``base(x) + lora_B(lora_A(x)) * s``:
after the thin products it scales the adapter's output and adds it to the base output, two passes
over a ``[tokens, out]`` tensor, and a third (the scaling's gradient) in backward: on the CPU with a
small model, a visible share of an update. Inside :func:`accumulated_adapters` each plain LoRA layer
instead adds ``s (x A^T) B^T`` into its base output in place, by one ``addmm_`` whose ``alpha`` is
the scaling: the same value up to float rounding, the same gradients (``addmm_``'s backward scales
only the thin ``[tokens, r]`` and ``[r, out]`` products), and no weight is copied or written.

Layers PEFT runs some other way keep their own forward: DoRA and other variants, a LoRA bias,
4-bit or non-linear bases, adapters in another dtype than the base (PEFT upcasts adapters of a
half-precision base), ``fan_in_fan_out`` weights, and calls with extra arguments.

**The KL reference** (:func:`reference_weights`). By default the reference is the base model,
reached by switching the adapter off. After a cold start the policy begins at an SFT adapter, and a
KL term to the base would pull it back towards the model that wrote no valid call; TRL and verl
instead take the policy at the start of RL as the reference.
:func:`~memalpha.lm.core.adapters.load_reference_adapter` loads the starting adapter a second time,
frozen, under :data:`REFERENCE_ADAPTER`, and :func:`reference_weights` runs a block with it active
(or, when there is none, with the adapter switched off). The base weights are shared: the second
adapter costs only its own LoRA matrices.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """Run the block with ``model`` in eval mode, then put it back in the mode it had
    (training stays training, eval stays eval), also when the block raises."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


def lora_linear_types() -> tuple[type, ...]:
    """PEFT's LoRA linear layer classes that fold: over a ``torch.nn.Linear`` and, where PEFT
    has it (bitsandbytes installed), over a 4-bit ``Linear4bit`` (PEFT wraps a 4-bit layer in
    its plain ``Linear`` when the model was not loaded quantised, as in a hand-made one)."""
    try:
        from peft.tuners.lora.layer import Linear as LoraLinear
    except ImportError:  # no PEFT installed: nothing to fold
        return ()
    try:
        from peft.tuners.lora.bnb import Linear4bit as LoraLinear4bit
    except (ImportError, AttributeError):
        return (LoraLinear,)
    return (LoraLinear, LoraLinear4bit)


def is_four_bit(layer) -> bool:
    """Whether ``layer`` is a bitsandbytes ``Linear4bit`` whose quantised weight ``dequantize_4bit``
    reads. Not one that bitsandbytes repacked for its AVX512-BF16 CPU kernel (at its first
    eval-mode forward on such a CPU): that layout only the kernel reads, and undoing it
    re-quantises the double-quantised scales, which would change the model."""
    try:
        from bitsandbytes.nn import Linear4bit
    except ImportError:
        return False
    state = getattr(layer.weight, "quant_state", None) if type(layer) is Linear4bit else None
    return state is not None and not getattr(state, "packing_format_for_cpu", False)


def base_weight(layer, quantised: bool = False) -> torch.Tensor | None:
    """The dense weight of a base linear layer: a float ``torch.nn.Linear``'s own weight (not a
    copy); with ``quantised`` a 4-bit layer's weight dequantised, as a new tensor in the layer's
    compute dtype (what its own forward multiplies in); None for anything else."""
    if type(layer) is torch.nn.Linear and layer.weight.is_floating_point():
        return layer.weight.detach()
    if quantised and is_four_bit(layer):
        from bitsandbytes.functional import dequantize_4bit

        weight = dequantize_4bit(layer.weight.data, layer.weight.quant_state)
        dtype = getattr(layer, "compute_dtype", None) or weight.dtype
        return weight.to(dtype)
    return None


def plain_adapters(module, quantised: bool = False) -> list[str] | None:
    """The active adapters of a PEFT LoRA linear layer over a float ``torch.nn.Linear`` (or, with
    ``quantised``, over a 4-bit ``Linear4bit``) when all of them are plain LoRA (no variant, no
    bias); None when the layer cannot be folded."""
    types = lora_linear_types()
    if type(module) not in types or module.disable_adapters or module.merged:
        return None
    base = module.get_base_layer()
    float_base = type(base) is torch.nn.Linear and base.weight.is_floating_point()
    if not (float_base or (quantised and is_four_bit(base))):
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
    (a new tensor when None). ``W`` is a float base's weight or a 4-bit base's dequantised one
    (:func:`base_weight`, in its compute dtype). Adapters in ``W``'s dtype are added by one
    ``addmm`` each, without a temporary of the weight's size; others (float32 adapters over a
    bf16 weight, say) through PEFT's ``get_delta_weight``, rounded to ``W``'s dtype once."""
    layer = module.get_base_layer()
    base = base_weight(layer, quantised=True)
    if out is not None:
        weight = out.copy_(base)
    elif is_four_bit(layer):
        weight = base  # already a fresh tensor
    else:
        weight = base.clone()
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


def foldable(module) -> bool:
    """Whether :func:`effective_weight` gives ``module``'s weight (without computing it)."""
    return plain_adapters(module) is not None or _own_weight(module) is not None


def _own_weight(module) -> torch.Tensor | None:
    """The weight of a ``torch.nn.Linear``, or of a PEFT LoRA layer whose adapters are off."""
    if type(module) is torch.nn.Linear:
        return module.weight.detach()
    if type(module) not in lora_linear_types():
        return None
    active = [name for name in module.active_adapters if name in module.lora_A]
    if module.disable_adapters or module.merged or not active:
        return base_weight(module.get_base_layer())  # a float torch.nn.Linear's; None for a 4-bit one
    return None


def dense_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear`` in ``weight``'s dtype, returned in ``x``'s: the casts a 4-bit layer's own
    forward makes (its inputs may be float32 next to bf16 weights after
    ``prepare_model_for_kbit_training``); no cast when the dtypes agree."""
    if x.dtype == weight.dtype:
        return F.linear(x, weight, bias)
    return F.linear(x.to(weight.dtype), weight, bias).to(x.dtype)


def _bias(layer, weight: torch.Tensor) -> torch.Tensor | None:
    bias = getattr(layer, "bias", None)
    return None if bias is None else bias.detach().to(weight.dtype)


@contextmanager
def folded_adapters(model, enabled: bool = True, quantised: bool = False) -> Iterator[int]:
    """Run every foldable LoRA layer of ``model`` as a single linear layer inside the block.

    Yields the number of layers folded (0 when ``enabled`` is False, when the adapters are
    disabled -- e.g. under ``model.disable_adapter()`` -- or when none qualifies). With
    ``quantised`` LoRA layers over 4-bit bases are folded too, and every other 4-bit layer (no
    adapter, or its adapter off) runs from a dequantised copy, counted as well: the whole model
    then multiplies dense weights. For inference only: the folded weights carry no gradient to
    the adapter. The copies are made when the block starts and dropped when it ends; the
    layers' own forwards are back then, also on an exception.
    """
    folded: list[torch.nn.Module] = []
    try:
        if enabled:
            with torch.no_grad():
                covered: set[int] = set()  # base layers whose LoRA layer runs folded
                for module in model.modules():
                    adapters = plain_adapters(module, quantised)
                    if adapters is not None:
                        weight = folded_weight(module, adapters)
                        base = module.get_base_layer()
                        covered.add(id(base))
                    elif quantised and is_four_bit(module) and id(module) not in covered:
                        weight, base = base_weight(module, quantised=True), module
                    else:
                        continue
                    module.forward = partial(dense_linear, weight=weight, bias=_bias(base, weight))
                    folded.append(module)
        yield len(folded)
    finally:
        for module in folded:
            del module.forward  # the instance attribute; the class's forward shows again

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


REFERENCE_ADAPTER = "reference"
ANSWER_ADAPTER = "answer"
"""The answer agent's adapter (``reader.adapter_path``): frozen beside the policy's own, on the same
base, active only while the local reader answers (:func:`adapter_weights`)."""


def holds_adapter(policy, name: str) -> bool:
    """Whether the PEFT ``policy`` holds an adapter named ``name``."""
    return name in getattr(policy, "peft_config", {})


def has_reference_adapter(policy) -> bool:
    return holds_adapter(policy, REFERENCE_ADAPTER)


@contextmanager
def same_adapter_and_trainables(policy) -> Iterator[None]:
    """Afterwards the active adapter and every parameter's ``requires_grad`` are as before
    (PEFT's ``load_adapter`` and ``set_adapter`` change which parameters train)."""
    trains = {name: p.requires_grad for name, p in policy.named_parameters()}
    active = policy.active_adapter
    try:
        yield
    finally:
        policy.set_adapter(active)
        for name, p in policy.named_parameters():
            p.requires_grad_(trains.get(name, False))


@contextmanager
def adapter_weights(policy, name: str) -> Iterator[None]:
    """Inside the block the PEFT ``policy`` computes with its adapter ``name`` alone (in inference
    mode); afterwards the previously active adapter is back and every parameter's
    ``requires_grad`` is what it was."""
    with same_adapter_and_trainables(policy):
        policy.set_adapter(name, inference_mode=True)
        yield


@contextmanager
def reference_weights(policy) -> Iterator[None]:
    """Inside the block the policy computes the reference: the :data:`REFERENCE_ADAPTER` if one
    is loaded, else the base model (``disable_adapter``). Afterwards the previously active
    adapter is back and every parameter's ``requires_grad`` is what it was."""
    if not has_reference_adapter(policy):
        with policy.disable_adapter():
            yield
        return
    with adapter_weights(policy, REFERENCE_ADAPTER):
        yield
