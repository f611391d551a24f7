"""The endless, resumable streams behind memalpha's DataModules.

A stream walks an item list pass after pass, each pass in a seeded order, and hands out a
fixed number of items per call (across a pass's end, or, with ``drop_last``, inside one pass).
Its whole position is two integers (:class:`PassCursor`), so a checkpoint that saves them
resumes on exactly the items an uninterrupted run would see. The module that trains fetches
each item itself (``training_step(dataloader_iter)``): a stream read ahead by Lightning's
prefetching would save a position past what was trained.
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

    def take(self, count: int, order_of: Callable[[int], list[int]], drop_last: bool = False) -> list[int]:
        """The next ``count`` indices of ``order_of(epoch)``, wrapping into the next pass.

        Without ``drop_last`` a take that reaches the end of a pass goes on with the next pass's
        first items. With ``drop_last`` every take lies inside one pass, as a DataLoader's
        batches with ``drop_last``: when fewer than ``count`` items are left the pass ends, they
        are skipped and the take starts the next pass. The position stays two integers: the
        skip happens when the next take comes, so a saved position resumes exactly either way.
        """
        picked: list[int] = []
        while len(picked) < count:
            order = order_of(self.epoch)
            if not order:
                raise ValueError("a stream cannot take items from an empty pass")
            if drop_last and len(order) < count:
                raise ValueError(
                    f"a pass of {len(order)} items cannot fill one take of {count} with drop_last"
                )
            if self.cursor >= len(order) or (drop_last and not picked and len(order) - self.cursor < count):
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
        while (item := self.next_item()) is not None:
            yield item


def endless_loader(next_item: Callable[[], Any]) -> DataLoader:
    """A DataLoader whose items are ``next_item()``, made in the main process: forever, or until
    ``next_item`` returns None (a stream with a fixed length, such as ``data.epochs``)."""
    return DataLoader(_Endless(next_item), batch_size=None, collate_fn=as_is, num_workers=0)
