"""The endless, resumable streams behind memalpha's DataModules.

A stream walks an item list pass after pass, each pass in a seeded order, and hands out a
fixed number of items per call. Its whole position is two integers (:class:`PassCursor`), so
a checkpoint that saves them resumes on exactly the items an uninterrupted run would see. The
module that trains fetches each item itself (``training_step(dataloader_iter)``): a stream
read ahead by Lightning's prefetching would save a position past what was trained.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from torch.utils.data import DataLoader, IterableDataset


def pass_order(count: int, seed: int, epoch: int, shuffle: bool = True) -> list[int]:
    """Item indices of pass ``epoch``: ``0..count-1``, shuffled with a seed of ``(seed, epoch)``."""
    order = list(range(count))
    if shuffle:
        random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return order


@dataclass
class PassCursor:
    """Where a stream stands: the pass (``epoch``) and the place in that pass's order."""

    epoch: int = 0
    cursor: int = 0

    def take(self, count: int, order_of: Callable[[int], list[int]]) -> list[int]:
        """The next ``count`` indices of ``order_of(epoch)``, wrapping into the next pass."""
        picked: list[int] = []
        while len(picked) < count:
            order = order_of(self.epoch)
            if not order:
                raise ValueError("a stream cannot take items from an empty pass")
            if self.cursor >= len(order):
                self.epoch, self.cursor = self.epoch + 1, 0
                continue
            picked.append(order[self.cursor])
            self.cursor += 1
        return picked


def as_is(item: Any) -> Any:
    """A collate function that leaves a batch as the dataset made it."""
    return item


class _Endless(IterableDataset):
    def __init__(self, next_item: Callable[[], Any]) -> None:
        self.next_item = next_item

    def __iter__(self) -> Iterator[Any]:
        while True:
            yield self.next_item()


def endless_loader(next_item: Callable[[], Any]) -> DataLoader:
    """A DataLoader whose items are ``next_item()``, forever, made in the main process."""
    return DataLoader(_Endless(next_item), batch_size=None, collate_fn=as_is, num_workers=0)
