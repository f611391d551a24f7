"""What each row of a decoding batch has emitted, and which rows are still live: the bookkeeping
memalpha's decoders (:mod:`memalpha.lm.sampling.fused_decode`, :mod:`memalpha.lm.sampling.graph_decode`)
share. A row ends at its first end-of-sequence token (kept); one that never emits it is truncated."""

from __future__ import annotations

from collections.abc import Sequence

import torch


class Responses:
    """What each row of a decoding batch has emitted, and which rows are still live."""

    def __init__(self, rows: int, eos_ids: Sequence[int]):
        self.tokens: list[list[int]] = [[] for _ in range(rows)]
        self.truncated = [True] * rows  # until the row emits an end token
        self.live = list(range(rows))
        self.eos = {int(token) for token in eos_ids}

    def add(self, picked: torch.Tensor | list[int]) -> list[int]:
        """Append each live row's token of ``picked`` ``[live]`` (a tensor, or a list already read
        to the host); returns the slots (positions among the live rows) of the rows that go on."""
        keep = []
        tokens = picked.tolist() if isinstance(picked, torch.Tensor) else picked
        for slot, (row, token) in enumerate(zip(self.live, tokens)):
            self.tokens[row].append(token)
            if token in self.eos:
                self.truncated[row] = False
            else:
                keep.append(slot)
        return keep

    def keep_only(self, keep: list[int]) -> None:
        self.live = [self.live[slot] for slot in keep]
