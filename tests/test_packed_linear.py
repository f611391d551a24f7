"""The linear product packed for a fixed number of rows (MKL's packed GEMM): the same values as
``F.linear`` for every row count, through the packed layout exactly where it serves."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from memalpha.lm.sampling.packed_linear import LinearProduct, can_pack, packing_available

needs_mkl = pytest.mark.skipif(not packing_available(), reason="this PyTorch build has no MKL packed product")


def _relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    return float((got.double() - expected).norm() / expected.norm())


@pytest.fixture
def packed_calls(monkeypatch):
    """The row counts of the calls that went through MKL's packed product."""
    calls: list[int] = []
    packed = torch.ops.mkl._mkl_linear

    def counting(x, *args):
        calls.append(x.shape[0])
        return packed(x, *args)

    monkeypatch.setattr(torch.ops.mkl, "_mkl_linear", counting)
    return calls


@needs_mkl
@pytest.mark.parametrize("with_bias", [True, False])
def test_every_row_count_gives_f_linear_values(packed_calls, with_bias):
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(40, 24, generator=generator)
    bias = torch.randn(40, generator=generator) if with_bias else None
    product = LinearProduct.build(weight, bias, rows=8)
    assert product.packed is not None and product.rows == 8
    for m in range(1, 12):
        x = torch.randn(m, 24, generator=generator)
        expected = F.linear(x.double(), weight.double(), None if bias is None else bias.double())
        got = product(x)
        assert got.shape == (m, 40) and got.dtype == torch.float32
        assert _relative_error(got, expected) < 1e-6, m
    # packed where more than half the rows it was laid out for are there, padded below 8
    assert packed_calls == [8, 8, 8, 8]


@needs_mkl
def test_packing_is_only_for_float32_cpu_weights_with_a_row_count():
    weight = torch.randn(6, 4)
    assert LinearProduct.build(weight, rows=None).packed is None
    assert LinearProduct.build(weight.double(), rows=4).packed is None
    assert not can_pack(weight.to(torch.bfloat16), None)
    assert not can_pack(weight, torch.zeros(6, dtype=torch.float64))
    x = torch.randn(3, 4, dtype=torch.float64)
    assert torch.equal(LinearProduct.build(weight.double(), rows=4)(x), F.linear(x, weight.double()))


@needs_mkl
def test_packing_leaves_the_weight_as_it_was():
    weight = torch.randn(6, 4)
    before = weight.clone()
    product = LinearProduct.build(weight, rows=4)
    product(torch.randn(4, 4))
    assert torch.equal(weight, before) and product.weight.data_ptr() == weight.data_ptr()
