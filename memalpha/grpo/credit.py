"""Credit assignment (``model.update.credit``; docs/metrics_and_rewards.md, "Credit"): which reward
each turn sample of a round is judged by, and against which other samples.

A scheme is one object holding both halves:

* where each turn's accuracy ``A_k`` comes from (:meth:`CreditScheme.turn_accuracy`): nowhere (the
  final accuracy ``r1`` broadcast to every turn), or the round's answers: the final ones and, when
  the scheme :attr:`~CreditScheme.asks_after_turns`, the answers the reader gave from the memory as
  it stood after every earlier turn. The rollout (:func:`memalpha.agent.rollout.answer_questions`)
  asks the scheme what to ask and hands it the scores; ``R'_k`` follows from ``A_k``
  (:func:`memalpha.agent.reward_math.per_chunk_totals`);
* which rewards it compares within which groups (:meth:`CreditScheme.compared`), which the step turns
  into advantages (:meth:`CreditScheme.advantages`).

Pure functions of plain values and ``[N]`` tensors, tested on hand-computed numbers. A new scheme is
a subclass registered under its name (:func:`register_credit_scheme`): ``update.credit`` accepts
every registered name, and nothing else in the package changes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import torch

from memalpha.grpo.advantages import group_advantages


class CreditScheme(ABC):
    """A credit-assignment scheme: subclasses set :attr:`name` and the two flags and define
    :meth:`compared`, and :meth:`turn_accuracy` when the turns earn their accuracy one by one."""

    name: str = ""
    asks_after_turns: bool = False
    """Whether the reader answers, after every memorising turn but the last, the questions answerable
    by then (their evidence read) from the memory as it stands (``per_chunk``): the rollout keeps a
    copy of each memory and asks in the same batch as the final answers."""
    needs_evidence: bool = False
    """Whether every question must say after which chunk it is answerable
    (``metadata.evidence_chunks``; checked before the model loads)."""

    def turn_accuracy(
        self, scores: Sequence[float], asked: Sequence[float], evidence: Sequence[int], turns: int
    ) -> list[float] | None:
        """``A_k`` for each of one rollout's ``turns`` turns, or None: every turn earns the final
        accuracy (the broadcast ``R_t`` alone). ``scores``: each question's final score;
        ``asked[k]`` (``k < turns - 1``, with :attr:`asks_after_turns`): the summed scores of the
        questions answered from the memory after turn ``k``; ``evidence``: each question's last
        evidence chunk (with :attr:`needs_evidence`)."""
        return None

    @abstractmethod
    def compared(self, rewards, turn_rewards, group_ids, turn_index) -> tuple[torch.Tensor, list]:
        """The ``[N]`` values the round's advantages are taken of and each one's group label, from the
        ``[N]`` broadcast rewards ``R_t``, turn rewards ``R'_k`` (None unless :meth:`turn_accuracy`
        gives ``A_k``), instance group ids and turn indices."""

    def advantages(self, rewards, turn_rewards, group_ids, turn_index, scale: str = "group") -> torch.Tensor:
        """The round's ``[N]`` advantages: :func:`~memalpha.grpo.advantages.group_advantages` of what
        the scheme compares."""
        values, labels = self.compared(rewards, turn_rewards, group_ids, turn_index)
        return group_advantages(values, labels, scale=scale)


def same_turn_groups(turn_rewards, group_ids, turn_index) -> tuple[torch.Tensor, list]:
    """Each turn's own reward ``R'_k`` against the same turn ``k`` of the other rollouts of its
    instance (``(instance, turn)`` groups)."""
    if turn_rewards is None:
        raise ValueError("per-turn credit needs the turn rewards of a rollout scored turn by turn")
    pairs = list(zip(torch.as_tensor(group_ids).tolist(), torch.as_tensor(turn_index).tolist(), strict=True))
    return torch.as_tensor(turn_rewards), pairs


class Broadcast(CreditScheme):
    """Mem-α's credit (the default): every turn's ``R_t`` (the final accuracy ``r1`` broadcast to all
    turns) against all turn samples of its instance's rollouts."""

    name = "broadcast"

    def compared(self, rewards, turn_rewards, group_ids, turn_index) -> tuple[torch.Tensor, list]:
        return torch.as_tensor(rewards), torch.as_tensor(group_ids).tolist()


class PerChunk(CreditScheme):
    """Turn ``k`` is paid the accuracy it added, read from the memory after it: ``A_k`` is the summed
    score of the questions answerable after turn ``k``, asked then, over all the rollout's questions
    (``A_{K-1} = r1``); compared within ``(instance, turn)`` groups."""

    name = "per_chunk"
    asks_after_turns = True
    needs_evidence = True

    def turn_accuracy(
        self, scores: Sequence[float], asked: Sequence[float], evidence: Sequence[int], turns: int
    ) -> list[float]:
        total = max(len(scores), 1)
        return [s / total for s in asked] + [sum(scores) / total]

    def compared(self, rewards, turn_rewards, group_ids, turn_index) -> tuple[torch.Tensor, list]:
        return same_turn_groups(turn_rewards, group_ids, turn_index)


def hindsight_accuracy(scores: Sequence[float], last: Sequence[int], turns: int) -> list[float]:
    """``A_k`` of hindsight credit for ``k < turns``: the summed final score of the questions whose
    last evidence chunk (``last``) is ``<= k``, over all questions."""
    total = max(len(scores), 1)
    return [sum(s for s, e in zip(scores, last, strict=True) if e <= k) / total for k in range(turns)]


class Hindsight(CreditScheme):
    """As :class:`PerChunk`, with each question's *final* score credited to the turn that read its
    last evidence chunk (:func:`hindsight_accuracy`): no extra reader questions, and a later turn
    that spoils a stored answer is not blamed."""

    name = "hindsight"
    needs_evidence = True

    def turn_accuracy(
        self, scores: Sequence[float], asked: Sequence[float], evidence: Sequence[int], turns: int
    ) -> list[float]:
        return hindsight_accuracy(scores, evidence, turns)

    def compared(self, rewards, turn_rewards, group_ids, turn_index) -> tuple[torch.Tensor, list]:
        return same_turn_groups(turn_rewards, group_ids, turn_index)


CREDIT_SCHEMES: dict[str, CreditScheme] = {}
"""Every registered scheme by its ``update.credit`` name."""


def register_credit_scheme(scheme: CreditScheme) -> CreditScheme:
    """Make ``scheme`` what ``update.credit: <scheme.name>`` trains with; a name is registered once."""
    if not scheme.name or scheme.name in CREDIT_SCHEMES:
        raise ValueError(f"a credit scheme needs a name no other scheme has, got {scheme.name!r}")
    CREDIT_SCHEMES[scheme.name] = scheme
    return scheme


def credit_scheme(name: str) -> CreditScheme:
    """The scheme ``update.credit`` names; a ValueError naming the key and the registered names."""
    if name not in CREDIT_SCHEMES:
        raise ValueError(f"update.credit must be one of {list(CREDIT_SCHEMES)}, got {name!r}")
    return CREDIT_SCHEMES[name]


BROADCAST = register_credit_scheme(Broadcast())
register_credit_scheme(PerChunk())
register_credit_scheme(Hindsight())
