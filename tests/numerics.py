"""Comparing two computations that must agree, on any machine.

Two paths through a model agree only up to the order of their float reductions, which differs
between machines, thread counts and batch shapes. The equality tests therefore run the tiny
models in float64 and compare whole tensors by the norm of their difference, never single
elements: one element near zero can carry a relative error of 1e-3 in float32 while the tensor
agrees to 1e-7. Hugging Face's Llama still computes its attention softmax and RMSNorm in float32
inside a float64 model, so float64 gradients agree to ~1e-7 of their norm, not to 1e-15; a real
bug (a missing gradient term, a wrong position) moves them by more than 1e-3.
"""

from __future__ import annotations

import torch

GRADIENT_REL = 1e-6
"""Relative norm difference allowed between two float64 gradient computations."""
VALUE_REL = 1e-10
"""Relative norm difference allowed between two float64 forward computations."""


def relative_difference(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """``||actual - expected|| / ||expected||`` (the absolute norm when ``expected`` is 0)."""
    if actual.shape != expected.shape:
        raise AssertionError(f"shapes differ: {tuple(actual.shape)} vs {tuple(expected.shape)}")
    diff = torch.linalg.vector_norm((actual - expected).double()).item()
    scale = torch.linalg.vector_norm(expected.double()).item()
    return diff / scale if scale > 0 else diff


def assert_close(actual: torch.Tensor, expected: torch.Tensor, rel: float, what: str = "tensor") -> None:
    error = relative_difference(actual, expected)
    assert error <= rel, f"{what}: relative norm difference {error:.3g} > {rel:g}"


def assert_same_gradients(
    actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], rel: float = GRADIENT_REL
):
    """Same parameter names, and every gradient within ``rel`` of the other by norm."""
    assert actual.keys() == expected.keys() and len(expected) > 0, (sorted(actual), sorted(expected))
    for name, grad in expected.items():
        assert_close(actual[name], grad, rel, name)
