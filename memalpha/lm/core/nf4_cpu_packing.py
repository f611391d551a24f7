"""Keeps bitsandbytes' CPU inference packing off the 4-bit layers that a LoRA is trained through.

On CPUs with AVX-512 BF16, bitsandbytes (0.48 and later) repacks a ``Linear4bit``'s weight for
its fused CPU inference kernel the first time the layer runs in eval mode on an input that needs
no gradient (``Linear4bit.forward`` calls ``_convert_weight_packed_for_cpu``). The packing stays:
every later call, training ones included, goes through ``gemv_4bit``, which has no backward, so
the gradients that flow through the frozen base to the LoRA weights come out wrong (a warning,
no error), and the packed scales are rounded to bfloat16. A GRPO step samples in eval mode under
``no_grad`` before it trains, so without this every NF4 step on such a CPU trained on wrong
gradients. Each layer reads its own ``support_avx512bf16_for_cpu`` flag before packing; turning
it off keeps the layer on the dequantise-then-matmul path, whose backward is right, in sampling,
scoring and training alike. Versions without the packing have no such flag and ignore it.
"""

from __future__ import annotations

import torch


def keep_nf4_layers_unpacked(model: torch.nn.Module) -> int:
    """Turn bitsandbytes' CPU inference packing off on every 4-bit layer of ``model``.

    Call it before the model first runs: a layer already packed cannot be unpacked exactly (its
    scales were rounded to bfloat16), so one found packed is an error. Returns how many 4-bit
    layers were found (0 when bitsandbytes is not installed or the model has none).
    """
    try:
        from bitsandbytes.nn import Linear4bit
    except ImportError:
        return 0
    layers = [module for module in model.modules() if isinstance(module, Linear4bit)]
    for layer in layers:
        if getattr(layer.weight.quant_state, "packing_format_for_cpu", False):
            raise RuntimeError(
                "a 4-bit layer was already packed for bitsandbytes' CPU inference kernel, which has no "
                "backward: turn the packing off before the model first runs in eval mode"
            )
        layer.support_avx512bf16_for_cpu = False
    return len(layers)
