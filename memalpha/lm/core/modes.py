"""The module mode around sampling and scoring: eval mode (dropout off) for a block, the caller's
mode back after it, however the block ends."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

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
