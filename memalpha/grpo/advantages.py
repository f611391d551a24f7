"""Group-relative advantages (GRPO): each reward against the other samples of its group.

``N`` rewards, each with a group label (in a memory-agent round, every turn sample of an
instance's rollouts is one group). Pure tensor functions, tested on hand-computed values.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, get_args

import torch

AdvantageScale = Literal["group", "batch", "none"]
ADVANTAGE_SCALES: tuple[str, ...] = get_args(AdvantageScale)


def _group_index(group_ids: torch.Tensor | Sequence, size: int) -> torch.Tensor:
    """Map arbitrary hashable group labels to consecutive integers (first appearance order)."""
    labels = group_ids.tolist() if isinstance(group_ids, torch.Tensor) else list(group_ids)
    if len(labels) != size:
        raise ValueError(f"group_ids has {len(labels)} entries but rewards has {size}")
    mapping: dict = {}
    return torch.tensor([mapping.setdefault(label, len(mapping)) for label in labels], dtype=torch.long)


def group_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor | Sequence,
    scale: str = "group",
    eps: float = 1e-6,
) -> torch.Tensor:
    """Group-relative advantages ``A_i = (r_i - mean_g) / (std + eps)``.

    Args:
        rewards: ``[N]`` scalar rewards.
        group_ids: ``[N]`` group label of each reward (tensor, or a list of any hashables).
        scale: ``group`` divides by the population std of the reward's group; ``batch`` by the
            population std of all ``N`` rewards; ``none`` only subtracts the group mean (Dr. GRPO).
        eps: added to the std.

    A group with a single member or with all rewards equal gets advantage exactly 0.
    Returns a float tensor ``[N]`` on the rewards' device.
    """
    if scale not in ADVANTAGE_SCALES:
        raise ValueError(f"scale must be one of {ADVANTAGE_SCALES}, got {scale!r}")
    rewards = torch.as_tensor(rewards)
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D, got shape {tuple(rewards.shape)}")
    if not rewards.is_floating_point():
        rewards = rewards.float()
    bad = (~torch.isfinite(rewards)).nonzero().flatten().tolist()
    if bad:
        raise ValueError(f"rewards at positions {bad[:10]} are not finite: {rewards[bad[:10]].tolist()}")
    size = rewards.shape[0]
    index = _group_index(group_ids, size).to(rewards.device)
    if size == 0:
        return rewards.clone()
    groups = int(index.max()) + 1
    zeros = rewards.new_zeros(groups)
    counts = zeros.index_add(0, index, torch.ones_like(rewards))
    means = zeros.index_add(0, index, rewards) / counts
    centred = rewards - means[index]
    highest = zeros.scatter_reduce(0, index, rewards, reduce="amax", include_self=False)
    lowest = zeros.scatter_reduce(0, index, rewards, reduce="amin", include_self=False)
    flat = (highest == lowest)[index]
    if scale == "group":
        stds = (zeros.index_add(0, index, centred**2) / counts).sqrt()
        advantages = centred / (stds[index] + eps)
    elif scale == "batch":
        advantages = centred / (rewards.std(unbiased=False) + eps)
    else:
        advantages = centred
    return torch.where(flat, torch.zeros_like(advantages), advantages)


def flat_group_share(rewards: torch.Tensor, group_ids: torch.Tensor | Sequence) -> float:
    """The share of groups whose rewards are all equal (or that have one member): their advantages
    are 0, so they teach nothing (``train/frac_reward_zero_std``)."""
    rewards = torch.as_tensor(rewards, dtype=torch.float64)
    index = _group_index(group_ids, rewards.shape[0])
    groups = [rewards[index == g] for g in index.unique().tolist()]
    flat = [len(group) < 2 or group.std(unbiased=False).item() < 1e-6 for group in groups]
    return sum(flat) / len(flat) if flat else 0.0


def advantage_shares(
    values: torch.Tensor, group_ids: torch.Tensor | Sequence, terms: dict[str, torch.Tensor]
) -> dict[str, float]:
    """How much of the round's push each reward term carries: for every name of ``terms``,
    ``sum_i c_i (t_i - mean_g t) (v_i - mean_g v) / sum_i c_i (v_i - mean_g v)^2``.

    ``values`` are the ``[N]`` values the advantages are taken of and ``terms`` their parts
    (``values == sum(terms.values())``, each ``[N]``, already weighted). Whatever the advantage's
    scale, a sample's advantage is its group's constant ``c_g >= 0`` times ``v_i - mean_g v``, so the
    shares sum to 1 (for ``group`` scaling ``c_g = 1 / std_g``, which weighs each group as the update
    does). A share near 1 means the advantages follow that term; a negative share means they push
    against it (it falls where the other terms rise). Empty when every group is flat (no push).
    """
    values = torch.as_tensor(values, dtype=torch.float64)
    index = _group_index(group_ids, values.shape[0])
    groups = int(index.max()) + 1 if values.numel() else 0
    zeros = values.new_zeros(groups)
    counts = zeros.index_add(0, index, torch.ones_like(values))

    def centred(x: torch.Tensor) -> torch.Tensor:
        x = torch.as_tensor(x, dtype=torch.float64)
        return x - (zeros.index_add(0, index, x) / counts)[index]

    v = centred(values)
    std = (zeros.index_add(0, index, v**2) / counts).sqrt()
    live = std > 1e-9
    inverse = 1.0 / torch.where(live, std, torch.ones_like(std))
    scale = torch.where(live, inverse, torch.zeros_like(std))[index]
    total = (scale * v * v).sum()
    if total <= 0:
        return {}
    return {name: ((scale * centred(t) * v).sum() / total).item() for name, t in terms.items()}
