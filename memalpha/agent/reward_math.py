"""The Mem-α reward (paper Eq. 1; docs/metrics_and_rewards.md): its terms, computed from plain values.

For chunk turn ``t`` of one rollout::

    R_t = accuracy_weight * r1 + r2_t + beta * r3 + gamma * r4_t

(``accuracy_weight`` 1 in the paper and by default.)

* ``r1``   mean question score of the reader over the final memory (per rollout);
* ``r2_t`` successful calls (``reward.call_success``: :func:`turn_call_successes`) / calls in
  turn ``t`` (every parse error of the turn is one failed call); 0 without calls;
* ``r3``   ``1 - memory_tokens / chunk_tokens`` (per rollout), gated by ``reward.compression_gate``;
* ``r4_t`` mean content validity of turn ``t``'s parsed calls, 0 without parsed calls, grounded
  by ``reward.content_grounding``.

Every function here computes from the values it is given and changes nothing; the one exception
is :func:`rollout_rewards`, which asks the content judge (:mod:`memalpha.agent.content_judges`)
for the verdicts r4 needs. The settings come checked (:mod:`memalpha.agent.reward_settings`).

**Support by the chunk** (the r2/r4 rule): a written text is supported by the chunk it was written
for when the content tokens it adds to the memory are mostly tokens of the chunk
(:func:`is_supported`; docs/metrics_and_rewards.md, "Supported by the chunk", with examples). Cheap
(set operations on words), deterministic and model-free. It does not tell a paraphrase from a copy
or a useful fact from filler; r1 and fact recall (:mod:`memalpha.agent.fact_recall`) measure that.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from memalpha.data.wrapping import parse_wrapped_chunk
from memalpha.tools.executor import SUCCESS_STATUSES
from memalpha.tools.schemas import DELETE, INSERT, UPDATE

if TYPE_CHECKING:
    from memalpha.agent.content_judges import ContentJudge
    from memalpha.agent.reward_settings import CompressionGate, RewardSettings
    from memalpha.tools.executor import ToolResult
    from memalpha.tools.formats import ParseError, ToolCall


STOP_WORDS = frozenset(
    (
        "a", "an", "the", "and", "or", "but", "if", "then", "than", "so", "of", "to", "in", "on", "at",
        "by", "for", "with", "from", "into", "onto", "over", "under", "about", "as", "is", "are", "was",
        "were", "be", "been", "being", "am", "do", "does", "did", "has", "have", "had", "having", "will",
        "would", "shall", "should", "can", "could", "may", "might", "must", "not", "no", "nor", "it", "its",
        "this", "that", "these", "those", "there", "here", "i", "me", "my", "we", "our", "you", "your",
        "he", "him", "his", "she", "her", "they", "them", "their", "what", "which", "who", "whom", "whose",
        "when", "where", "why", "how", "all", "any", "some", "each", "every", "also", "just", "very", "too",
        "only", "own", "same", "such", "up", "down", "out", "off", "again", "once"
    )
)
"""Function words that carry no content of their own; they never count as support."""

_TOKEN = re.compile(r"[a-z0-9]+")


def content_tokens(text: str) -> frozenset[str]:
    """The set of lower-cased letter/digit runs of ``text`` that are not :data:`STOP_WORDS`."""
    return frozenset(t for t in _TOKEN.findall(text.lower()) if t not in STOP_WORDS)


def chunk_tokens(chunk: str) -> frozenset[str]:
    """Content tokens of ``chunk``'s own text: a chunk made by memalpha's wrapper loses the wrapper's
    words and keeps its date; any other chunk counts whole."""
    wrapped = parse_wrapped_chunk(chunk)
    if wrapped is None:
        return content_tokens(chunk)
    return content_tokens(f"{wrapped.day:%Y-%m-%d} {wrapped.text}")


def added_tokens(text: str, replaced: str | None = None) -> frozenset[str]:
    """Content tokens of ``text`` that ``replaced`` (the text it overwrites) does not hold."""
    tokens = content_tokens(text)
    return tokens - content_tokens(replaced) if replaced else tokens


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def repeats_itself(text: str) -> bool:
    """Whether ``text`` says one of its sentences twice (the same words, case and punctuation aside;
    sentences of fewer than 2 words left out): the loop a small model falls into, "A. B. A. B. A."
    until its reply is cut."""
    seen: set[str] = set()
    for sentence in _SENTENCE_END.split(text):
        words = _TOKEN.findall(sentence.lower())
        if len(words) < 2:
            continue
        key = " ".join(words)
        if key in seen:
            return True
        seen.add(key)
    return False


def is_supported(
    text: str, source: frozenset[str], *, replaced: str | None = None, min_share: float, min_tokens: int
) -> bool:
    """Whether ``text``, written over ``replaced``, adds at least ``min_tokens`` tokens of ``source``
    (a chunk's :func:`chunk_tokens`) that are at least ``min_share`` of all it adds, and says none of
    its sentences twice (:func:`repeats_itself`: a second copy adds nothing to the memory, and a loop
    that runs on loses its call when the reply is cut)."""
    if repeats_itself(text):
        return False
    added = added_tokens(text, replaced)
    shared = len(added & source)
    return shared >= min_tokens and shared >= min_share * len(added)


@dataclass
class TurnCalls:
    """What one chunk turn's response did: executed calls, the calls that did not parse, and the
    chunk the turn read (the support rule's source; needed by ``call_success: memalpha`` and
    ``content_grounding: chunk``)."""

    results: list[ToolResult] = field(default_factory=list)
    parse_errors: list[ParseError] = field(default_factory=list)
    chunk: str | None = None


@dataclass
class RolloutReward:
    """Every reward component of one rollout; ``total[t]`` is ``R_t``."""

    r1: float
    r3: float
    r2: list[float]
    r4: list[float]
    total: list[float]


# ---------------------------------------------------------------------------
# r1: accuracy
# ---------------------------------------------------------------------------


def accuracy_reward(question_scores: Sequence[float]) -> float:
    """r1: the mean question score (0 for an instance without questions)."""
    return float(sum(question_scores) / len(question_scores)) if question_scores else 0.0


# ---------------------------------------------------------------------------
# r2: tool success
# ---------------------------------------------------------------------------


def _status_success(result: ToolResult) -> bool:
    """``status``: the statuses ``ok`` and ``skipped``."""
    return result.status in SUCCESS_STATUSES


def _official_success(result: ToolResult) -> bool:
    """``official``: what the official code reports for the same call. Its tools differ from
    memalpha's executor in three places: its insert of a text already stored reports ``skipped``,
    which it counts as a failure; its update to an unchanged text and its deletion of an empty core
    report success (memalpha: ``skipped``); and its deletion of a list item by an unknown or missing
    id deletes nothing and reports success (memalpha: an error). Every other error is a failure there
    too (updating an unknown id raises in the official store)."""
    call = result.call
    if result.status == "ok":
        return True
    if result.status == "skipped":
        return call is None or call.name != INSERT
    if call is None or call.name != DELETE:
        return False
    arguments = call.arguments if isinstance(call.arguments, dict) else {}
    memory_id_missing = (
        result.code == "missing_argument" and "memory_type" in arguments and "memory_id" not in arguments
    )
    return result.code == "unknown_id" or memory_id_missing


def written_text(call: ToolCall | None) -> str | None:
    """The text an insert (``content``) or update (``new_content``) writes; None for any other call."""
    if call is None or not isinstance(call.arguments, dict):
        return None
    key = {INSERT: "content", UPDATE: "new_content"}.get(call.name)
    text = call.arguments.get(key) if key else None
    return text if isinstance(text, str) else None


def supported_write(result: ToolResult, source: frozenset[str], weights: RewardSettings) -> bool:
    """Whether ``result``'s call writes a text that the chunk with content tokens ``source``
    supports (:func:`is_supported`; an executed update is judged by what
    it adds to the text it replaced)."""
    text = written_text(result.call)
    if text is None:
        return False
    return is_supported(
        text, source, replaced=result.replaced,
        min_share=weights.support_min_share, min_tokens=weights.support_min_tokens,
    )


def _chunk_source(turn: TurnCalls, setting: str) -> frozenset[str]:
    if turn.chunk is None:
        raise ValueError(f"{setting} needs each turn's chunk (TurnCalls.chunk) to judge what its calls write")
    return chunk_tokens(turn.chunk)


def supported_changes(turn: TurnCalls, weights: RewardSettings) -> int:
    """``call_success: memalpha``: a call succeeds when it changed the memory (status ``ok``) and,
    if it writes, its chunk supports what it writes; a deletion succeeds only in a turn where some
    call stored a supported text, and so does nothing else: a turn without one has no success at all."""
    source = _chunk_source(turn, "reward.call_success: memalpha")
    changed = [r for r in turn.results if r.status == "ok" and r.call is not None]
    stored = [r for r in changed if supported_write(r, source, weights)]
    if not stored:
        return 0
    deletions = [r for r in changed if r.call.name == DELETE]
    return len(stored) + len(deletions)


def _each_call(succeeded: Callable[[ToolResult], bool]) -> Callable[[TurnCalls, RewardSettings], int]:
    """A turn's successes under a rule that judges each call by its result alone."""
    return lambda turn, weights: sum(succeeded(r) for r in turn.results)


CALL_SUCCESS: dict[str, Callable[[TurnCalls, RewardSettings], int]] = {
    "memalpha": supported_changes,
    "status": _each_call(_status_success),
    "official": _each_call(_official_success),
}
"""Each ``reward.call_success`` name's count of a turn's successful calls (its keys are the values of
:data:`~memalpha.agent.reward_settings.CallSuccessRule`)."""


def turn_call_successes(turn: TurnCalls, weights: RewardSettings) -> int:
    """The calls of ``turn`` that r2 counts as successful under ``weights.call_success``."""
    return CALL_SUCCESS[weights.call_success](turn, weights)


def tool_success_reward(turn: TurnCalls, weights: RewardSettings) -> float:
    """r2_t: successful calls (:func:`turn_call_successes`) over all calls of the turn (parse
    errors are failed calls); 0 for a turn without calls."""
    total = len(turn.results) + len(turn.parse_errors)
    if total == 0:
        return 0.0
    return turn_call_successes(turn, weights) / total


# ---------------------------------------------------------------------------
# r3: compression
# ---------------------------------------------------------------------------


def compression_reward(memory_tokens: int, chunk_tokens: int) -> float:
    """r3 as the paper defines it: ``1 - memory_tokens / chunk_tokens``."""
    if chunk_tokens <= 0:
        raise ValueError(f"chunk_tokens must be > 0 to compute the compression reward, got {chunk_tokens}")
    return 1.0 - memory_tokens / chunk_tokens


def gated_compression(compression: float, accuracy: float, gate: CompressionGate) -> float:
    """r3 under ``reward.compression_gate``: ``accuracy`` scales a positive compression by r1 (a
    negative one stays whole); ``none`` leaves it as it is."""
    if gate == "none" or compression < 0:
        return compression
    return accuracy * compression


# ---------------------------------------------------------------------------
# r4: content validity
# ---------------------------------------------------------------------------


def parsed_calls(turns: Sequence[TurnCalls]) -> list[ToolCall]:
    """Every parsed call of a rollout, turn by turn: what the content judge scores."""
    return [res.call for t in turns for res in t.results if res.call is not None]


def content_rewards(turns: Sequence[TurnCalls], verdicts: Sequence[float] | None,
                    weights: RewardSettings) -> list[float]:
    """r4_t of every turn from the judge's ``verdicts``, one per call of :func:`parsed_calls`
    (None: nothing was judged, and every r4_t is 0).

    A turn's r4 is the mean over its results; a result without a call scores 0 but counts in the
    mean. Under ``content_grounding: chunk`` a verdict counts only when its call writes a text
    its turn's chunk supports.
    """
    if verdicts is None:
        return [0.0] * len(turns)
    judged = iter(verdicts)
    grounded = weights.content_grounding == "chunk"
    r4: list[float] = []
    for t in turns:
        judged_here = grounded and bool(t.results)
        source = _chunk_source(t, "reward.content_grounding: chunk") if judged_here else frozenset()
        turn_scores = []
        for res in t.results:
            if res.call is None:
                turn_scores.append(0.0)
                continue
            verdict = next(judged)
            turn_scores.append(verdict if not grounded or supported_write(res, source, weights) else 0.0)
        r4.append(sum(turn_scores) / len(turn_scores) if turn_scores else 0.0)
    return r4


def judged_verdicts(turns: Sequence[TurnCalls], weights: RewardSettings,
                    content_judge: ContentJudge | None) -> list[float] | None:
    """The judge's verdict on every call of :func:`parsed_calls`, in one batch; None without a
    judge, with ``weights.gamma == 0`` or without calls (r4 is then reported as 0 unjudged)."""
    calls = parsed_calls(turns)
    if content_judge is None or weights.gamma == 0 or not calls:
        return None
    verdicts = list(content_judge.judge(calls))
    if len(verdicts) != len(calls):
        raise RuntimeError(f"content judge returned {len(verdicts)} scores for {len(calls)} calls")
    return verdicts


# ---------------------------------------------------------------------------
# R_t
# ---------------------------------------------------------------------------


def turn_totals(r1: float, r2: Sequence[float], r3: float, r4: Sequence[float],
                weights: RewardSettings) -> list[float]:
    """``R_t = accuracy_weight * r1 + r2_t + beta * r3 + gamma * r4_t`` for every turn."""
    return [
        weights.accuracy_weight * r1 + a + weights.beta * r3 + weights.gamma * b
        for a, b in zip(r2, r4, strict=True)
    ]


def per_chunk_totals(
    turn_accuracy: Sequence[float],
    r2: Sequence[float],
    r3: float,
    r4: Sequence[float],
    weights: RewardSettings,
) -> list[float]:
    """Per-turn credit (a scheme whose :meth:`~memalpha.grpo.credit.CreditScheme.turn_accuracy` gives
    ``A_k``: ``per_chunk``, ``hindsight``): ``R'_k = w * K * (A_k -
    A_{k-1}) + r2_k + beta * r3 + gamma * r4_k`` over the rollout's ``K`` turns, where ``A_k``
    (``turn_accuracy``) is the summed score of the questions answerable after turn ``k`` (from the
    memory after turn ``k``, or from the final memory) over all questions (``A_{-1} = 0``,
    ``A_{K-1} = r1``). The gains telescope, so the turns' accuracy credits sum to ``w * K * r1``,
    the broadcast's total."""
    turns = len(turn_accuracy)
    gains = [now - before for now, before in zip(turn_accuracy, [0.0, *turn_accuracy[:-1]])]
    return [
        weights.accuracy_weight * turns * gain + a + weights.beta * r3 + weights.gamma * b
        for gain, a, b in zip(gains, r2, r4, strict=True)
    ]


def rollout_rewards(
    question_scores: Sequence[float],
    turns: Sequence[TurnCalls],
    memory_tokens: int,
    chunk_tokens: int,
    weights: RewardSettings,
    content_judge: ContentJudge | None,
) -> RolloutReward:
    """All components and ``R_t`` for one rollout (see the module docstring).

    The content judge sees every parsed call of the rollout in one batch
    (:func:`judged_verdicts`). With ``weights.gamma == 0`` or no judge, r4 is reported as 0
    without judging. Under ``content_grounding: chunk`` a call's verdict counts only when it
    writes a text its turn's chunk supports.
    """
    r1 = accuracy_reward(question_scores)
    # an instance with nothing to read (the memories layout: a memory already written) compresses nothing
    r3 = 0.0 if chunk_tokens == 0 and not turns else gated_compression(
        compression_reward(memory_tokens, chunk_tokens), r1, weights.compression_gate
    )
    r2 = [tool_success_reward(t, weights) for t in turns]
    r4 = content_rewards(turns, judged_verdicts(turns, weights, content_judge), weights)
    return RolloutReward(r1=r1, r3=r3, r2=r2, r4=r4, total=turn_totals(r1, r2, r3, r4, weights))
