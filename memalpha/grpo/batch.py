"""The typed GRPO batch: what one optimiser step trains on, and how a round is cut into them.

A rollout round yields turn samples (prompt and response token ids), each with its
group-relative advantage and, when needed, the response log-probs of the sampling policy
(``old_logps``, for the PPO ratio when a round feeds several optimiser steps) and of the
reference (``ref_logps``, for the KL penalty). :class:`GRPOBatch` holds them row-aligned;
:func:`cut_minibatches` splits a round's batch into the mini-batches of its optimiser steps.
Logging payloads (round metrics, sample text) never travel in a batch, so checkpoints that
hold unserved batches hold training data only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from memalpha.seeding import stable_seed


@dataclass
class GRPOBatch:
    """``B`` turn samples, row-aligned.

    Args:
        prompt_ids: ``B`` prompts as token-id lists.
        response_ids: ``B`` responses as token-id lists (what the policy sampled).
        advantages: ``[B]`` float tensor of group-relative advantages.
        old_logps: ``B`` float tensors (one per response, its length) of the sampling policy's
            log-probs, or None: the ratio is taken on-policy (one optimiser step per round).
        ref_logps: ``B`` float tensors of the reference's log-probs, or None: no KL term
            (``kl_coef`` must be 0).
    """

    prompt_ids: list[list[int]]
    response_ids: list[list[int]]
    advantages: torch.Tensor
    old_logps: list[torch.Tensor] | None = None
    ref_logps: list[torch.Tensor] | None = None

    def __post_init__(self) -> None:
        rows = len(self.prompt_ids)
        sizes = {
            "response_ids": len(self.response_ids),
            "advantages": int(self.advantages.shape[0]) if self.advantages.dim() == 1 else -1,
            "old_logps": rows if self.old_logps is None else len(self.old_logps),
            "ref_logps": rows if self.ref_logps is None else len(self.ref_logps),
        }
        wrong = {name: size for name, size in sizes.items() if size != rows}
        if wrong:
            raise ValueError(f"GRPOBatch: prompt_ids has {rows} rows but {wrong} (advantages must be 1-D)")

    def __len__(self) -> int:
        return len(self.prompt_ids)

    @property
    def response_tokens(self) -> int:
        """Number of response tokens in the batch (the token-mean denominator)."""
        return sum(len(response) for response in self.response_ids)

    def state_dict(self) -> dict[str, Any]:
        """Plain containers and tensors only, so a checkpoint holding the batch loads with
        ``weights_only``; ``GRPOBatch(**state)`` is the batch again."""
        return {
            "prompt_ids": [list(p) for p in self.prompt_ids],
            "response_ids": [list(r) for r in self.response_ids],
            "advantages": self.advantages,
            "old_logps": None if self.old_logps is None else list(self.old_logps),
            "ref_logps": None if self.ref_logps is None else list(self.ref_logps),
        }

    def select(self, rows: Sequence[int]) -> GRPOBatch:
        """The batch of ``rows`` (in that order; repeats allowed)."""
        rows = [int(row) for row in rows]
        return GRPOBatch(
            prompt_ids=[self.prompt_ids[row] for row in rows],
            response_ids=[self.response_ids[row] for row in rows],
            advantages=self.advantages[torch.as_tensor(rows, dtype=torch.long)],
            old_logps=None if self.old_logps is None else [self.old_logps[row] for row in rows],
            ref_logps=None if self.ref_logps is None else [self.ref_logps[row] for row in rows],
        )


def cut_minibatches(batch: GRPOBatch, num_mini_batches: int, ppo_epochs: int, seed: int) -> list[GRPOBatch]:
    """A round's optimiser-step batches: ``ppo_epochs`` passes, each cut into ``num_mini_batches``.

    The first pass keeps the round's order; every later pass reshuffles it with a seed derived
    from ``seed`` and the pass index. Each pass is spread evenly over its mini-batches (their
    sizes differ by at most one, the larger first), so no step trains on a short remainder; with
    ``update.mini_batch_size`` the count comes from
    :meth:`~memalpha.grpo.settings.UpdateSettings.mini_batches_per_epoch`. A round with fewer
    samples than ``num_mini_batches`` is cut into one-sample mini-batches. Returns
    ``ppo_epochs * min(num_mini_batches, len(batch))`` batches in the order they are trained.
    """
    if len(batch) == 0:
        raise ValueError("cannot cut an empty batch into mini-batches")
    parts: list[GRPOBatch] = []
    order = torch.arange(len(batch))
    for epoch in range(ppo_epochs):
        if epoch > 0:
            generator = torch.Generator().manual_seed(stable_seed(seed, "epoch", epoch))
            order = torch.randperm(len(batch), generator=generator)
        for rows in torch.tensor_split(order, min(num_mini_batches, len(batch))):
            parts.append(batch.select(rows.tolist()))
    return parts
