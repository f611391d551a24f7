"""A linear product whose weight is laid out once for a fixed number of input rows.

A decoding step multiplies a handful of rows (one token per sampled row) with every weight of
the model, so it is bound by how fast the weights stream through the cores. For such thin
float32 products MKL's general matrix product repacks the weight on every call; its packed
API (``cblas_sgemm_pack`` once, ``cblas_sgemm_compute`` per call) lays the weight out once for
a given number of rows and then reads it as it is. PyTorch exposes that API as the
``mkl::_mkl_reorder_linear_weight`` / ``mkl::_mkl_linear`` operators its own compiler uses for
frozen float32 linear layers on the CPU.

:class:`LinearProduct` packs a weight for ``rows`` input rows when that API is there (float32
weights on the CPU of an MKL build of PyTorch) and otherwise is plain ``F.linear``. The packed
layout serves exactly ``rows`` rows, so fewer rows are padded with zeros up to ``rows`` while
they are more than half of them, and take ``F.linear`` below that (a decoding batch shrinks
as its rows end; the timings that set the bound are in ``docs/results.md``). The packed copy
costs as much memory as the weight and is made when the product is built.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


def packing_available() -> bool:
    """Whether this PyTorch build has MKL's packed float32 product (x86 builds with MKL)."""
    mkl = getattr(torch.ops, "mkl", None)
    return bool(torch._C.has_mkl) and all(
        hasattr(mkl, name) for name in ("_mkl_reorder_linear_weight", "_mkl_linear")
    )


def can_pack(weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether ``x @ weight.T + bias`` can run as MKL's packed product."""
    tensors = [weight] + ([] if bias is None else [bias])
    return (
        weight.dim() == 2
        and all(t.dtype == torch.float32 and t.device.type == "cpu" for t in tensors)
        and packing_available()
    )


@dataclass(frozen=True)
class LinearProduct:
    """``F.linear(x, weight, bias)`` for ``x`` ``[m, in]``, through a copy of ``weight`` packed for
    ``rows`` rows when ``packed`` is set.

    Build it with :meth:`build`. The packed path is taken for ``rows / 2 < m <= rows`` (rows
    padded to ``rows``); any other ``m`` runs ``F.linear`` on ``weight``. Inference only: the
    packed product carries no gradient.
    """

    weight: torch.Tensor
    bias: torch.Tensor | None = None
    packed: torch.Tensor | None = None
    rows: int = 0

    @classmethod
    def build(
        cls, weight: torch.Tensor, bias: torch.Tensor | None = None, rows: int | None = None
    ) -> LinearProduct:
        """The product of ``weight`` ``[out, in]`` and ``bias`` ``[out]``, packed for ``rows`` input
        rows when ``rows`` is given and :func:`can_pack` allows it (plain otherwise)."""
        weight = weight.detach()
        bias = None if bias is None else bias.detach()
        if rows is None or rows < 1 or not can_pack(weight, bias):
            return cls(weight, bias)
        weight = weight.contiguous()
        bias = None if bias is None else bias.contiguous()
        with torch.no_grad():
            packed = torch.ops.mkl._mkl_reorder_linear_weight(weight, rows)
        return cls(weight, bias, packed, rows)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        m = x.shape[0]
        if self.packed is None or not self.rows / 2 < m <= self.rows or x.dim() != 2:
            return F.linear(x, self.weight, self.bias)
        if m < self.rows:  # the packed layout serves exactly `rows` rows
            x = F.pad(x, (0, 0, 0, self.rows - m))
        return torch.ops.mkl._mkl_linear(x, self.packed, self.weight, self.bias, self.rows)[:m]
