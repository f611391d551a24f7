"""The Mem-α reward (paper Eq. 1; docs/metrics_and_rewards.md) and its content-validity judges.

For chunk turn ``t`` of one rollout::

    R_t = accuracy_weight * r1 + r2_t + beta * r3 + gamma * r4_t

(``accuracy_weight`` 1 in the paper and by default.)

* ``r1``   mean question score of the reader over the final memory (per rollout);
* ``r2_t`` successful calls / calls in turn ``t`` (every parse error of the turn is one failed
  call); 0 without calls. What succeeds is ``reward.call_success`` (:func:`turn_call_successes`):
  ``memalpha`` counts a call that changed the memory (status ``ok``) and, when it writes, writes
  something its turn's chunk supports (:mod:`memalpha.agent.grounding`), and gives the turn 0 when
  none of its calls stores such a text; ``status`` counts the statuses ``ok`` and ``skipped``;
  ``official`` counts what the official code reports as executed and not skipped;
* ``r3``   ``1 - memory_tokens / chunk_tokens`` (per rollout; negative when memory outgrows
  the input); under ``reward.compression_gate: accuracy`` (memalpha) a positive value is
  multiplied by r1, so a memory that answers nothing earns no compression;
* ``r4_t`` mean content validity of turn ``t``'s parsed calls, 0 without parsed calls; under
  ``reward.content_grounding: chunk`` (memalpha) a write its chunk does not support scores 0.

Content validity is judged per call by a pluggable judge:

* :class:`RuleContentJudge` (default, free): core must be a real paragraph (not empty, not a
  stand-in such as "summary goes here", never mentioning "core memory"); an episodic entry
  must carry a time expression; a semantic entry must be a non-empty statement.
* :class:`LLMContentJudge`: the paper's judgement through a reader, which answers with a
  JSON object ``{"VALID": bool, "ISSUES": [...], "EXPLANATION": str}``, sampled with the
  reader's settings or the judge's own (``reward.content_judge_temperature`` and
  ``content_judge_max_tokens``; official 0.1 and 512); a write whose judgement is malformed, or
  whose reader call failed, is asked again up to ``reward.content_judge_attempts`` asks in all
  (default 1) and scores 0 when none is well-formed.

As in the official code, deletions carry no content and score 0 (``delete_score``), and
calls are judged by their arguments whether or not they executed.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, get_args

from memalpha.agent.grounding import chunk_tokens, is_supported
from memalpha.agent.prompts import content_judge_messages
from memalpha.agent.scoring import MetricStyle, check_metric_overrides, check_metric_style, strip_thinking
from memalpha.reader.base import Sampling
from memalpha.tools.executor import SUCCESS_STATUSES
from memalpha.tools.schemas import DELETE, INSERT, UPDATE

ContentJudgeKind = Literal["rule", "llm"]
CONTENT_JUDGES: tuple[str, ...] = get_args(ContentJudgeKind)
CallSuccessRule = Literal["memalpha", "status", "official"]
CALL_SUCCESS_RULES: tuple[str, ...] = get_args(CallSuccessRule)
ContentGrounding = Literal["chunk", "none"]
CONTENT_GROUNDINGS: tuple[str, ...] = get_args(ContentGrounding)
CompressionGate = Literal["accuracy", "none"]
COMPRESSION_GATES: tuple[str, ...] = get_args(CompressionGate)
JudgementParse = Literal["memalpha", "official"]
JUDGEMENT_PARSES: tuple[str, ...] = get_args(JudgementParse)

if TYPE_CHECKING:
    from memalpha.reader.base import Reader
    from memalpha.tools.executor import ToolResult
    from memalpha.tools.formats import ParseError, ToolCall

logger = logging.getLogger(__name__)


@dataclass
class RewardSettings:
    """The reward's weights, its content judge and the answer metric of each data source.

    Args:
        beta: Weight of the compression reward r3 (paper 0.05).
        gamma: Weight of the content-validity reward r4 (scripts 0.1).
        accuracy_weight: Weight of the accuracy reward r1 against the tool reward r2, whose
            weight is 1 (paper 1). Above 1 a rollout's answers count for more than its call
            format: once nearly every call succeeds, r2 barely varies within a group, and r1 is
            the term the advantages should follow (docs/results.md, "grpo_levers").
        content_judge: r4 judge: ``rule`` (deterministic checks) or ``llm`` (the reader judges, paper style).
        metric_overrides: ``data_source`` -> metric name, overriding the default registry mapping.
        metric_style: How an answer is compared with its gold, in the training reward r1 and in
            validation alike (docs/metrics_and_rewards.md, official difference 10): ``memalpha``
            normalises (punctuation, articles, white space; best of all golds; the judge's
            yes and not the word no) so that a right answer written differently scores;
            ``official`` compares as the official code does (the lower-cased first gold in the
            answer; perltqa parts in the prediction as written; a boxed label only when it is
            digits; the judge's yes only when no ``no`` appears anywhere in its reply).
        call_success: What r2 counts as a successful call (official difference 7). ``memalpha``:
            a call that changed the memory (status ``ok``: no ``skipped`` repeat or no-op, no
            error) and, for an insert or update, whose written text the turn's chunk supports
            (``support_min_share``, ``support_min_tokens``); a turn none of whose calls stores
            such a text gets r2 = 0, so deleting and rewriting alone earn nothing. ``status``
            (memalpha before issue 30): the statuses ``ok`` and ``skipped``. ``official``: what
            the official code reports as executed and not skipped, so a duplicate insert fails
            and deleting an unknown id succeeds (its code deletes nothing and reports success);
            the executor runs the same under all three.
        support_min_share: The support rule's share (``call_success: memalpha``, ``content_grounding:
            chunk``): of the content tokens a write adds to the memory (lower-cased words and
            numbers, function words dropped, those of the text it replaces removed), at least
            this share must occur in the turn's chunk (its text without memalpha's dated
            wrapper). In (0, 1].
        support_min_tokens: The support rule's count: at least this many of the added content
            tokens must occur in the chunk (>= 1), so a one-word write is never supported.
        content_grounding: ``chunk`` (memalpha): r4 scores a write 0 when the support rule says
            its chunk does not support it, so a valid-looking sentence about nothing in the chunk
            earns no content reward; ``none`` (official): r4 is the judge's verdict alone.
        compression_gate: ``accuracy`` (memalpha): a positive compression r3 is multiplied by r1,
            so an empty or useless memory (r1 = 0) earns no compression reward, while a memory
            larger than the input keeps its whole negative r3; ``none`` (official): r3 as the
            paper defines it, ``1 - memory / input`` (an empty memory earns 1).
        content_judge_attempts: The most asks the ``llm`` judge spends on one write: a write
            whose judgement is malformed (or whose reader call failed) is asked again until this
            many asks in all, then scores 0; 1 asks once. Each ask after a malformed reply appends
            the template file's ``content_judge_retry`` to the user message once more (absent, as
            in memalpha's texts: the same messages again). The official training judge
            (``/analyze_function``) asks once; its per-call judge, which training never calls,
            up to 3 times.
        content_judge_temperature: Sampling temperature of the ``llm`` judge's requests (0 =
            greedy); null: the reader's own (``reader.temperature``). Official 0.1.
        content_judge_max_tokens: Reply length cap of the ``llm`` judge's requests; null: the
            reader's own (``reader.max_new_tokens``). Official 512.
        content_judge_parse: Which judge replies are well-formed (the rest are malformed):
            ``memalpha`` reads the JSON object from a code fence or bare, after any thinking
            block; ``official`` reads the first fenced object of the reply as it is, and only
            when the reply opens a fence tagged ``json``, as the official code checks
            (``_validate_json_format``). Both need a boolean ``VALID``, a list ``ISSUES`` and a
            text ``EXPLANATION``.
    """

    beta: float = 0.05
    gamma: float = 0.1
    accuracy_weight: float = 1.0
    content_judge: ContentJudgeKind = "rule"
    metric_overrides: dict[str, str] | None = None
    metric_style: MetricStyle = "memalpha"
    call_success: CallSuccessRule = "memalpha"
    support_min_share: float = 0.5
    support_min_tokens: int = 2
    content_grounding: ContentGrounding = "chunk"
    compression_gate: CompressionGate = "accuracy"
    content_judge_attempts: int = 1
    content_judge_temperature: float | None = None
    content_judge_max_tokens: int | None = None
    content_judge_parse: JudgementParse = "memalpha"

    def __post_init__(self) -> None:
        if self.content_judge not in CONTENT_JUDGES:
            raise ValueError(f"reward.content_judge must be one of {list(CONTENT_JUDGES)}, got {self.content_judge!r}")
        if self.beta < 0 or self.gamma < 0:
            raise ValueError(f"reward.beta and reward.gamma must be >= 0, got {self.beta}, {self.gamma}")
        if not self.accuracy_weight >= 0:
            raise ValueError(f"reward.accuracy_weight must be >= 0, got {self.accuracy_weight}")
        if self.metric_overrides:
            check_metric_overrides(self.metric_overrides, "reward.metric_overrides")
        check_metric_style(self.metric_style, "reward.metric_style")
        if self.call_success not in CALL_SUCCESS_RULES:
            raise ValueError(
                f"reward.call_success must be one of {list(CALL_SUCCESS_RULES)}, got {self.call_success!r}"
            )
        if not 0.0 < self.support_min_share <= 1.0:
            raise ValueError(f"reward.support_min_share must be in (0, 1], got {self.support_min_share}")
        if isinstance(self.support_min_tokens, bool) or self.support_min_tokens < 1:
            raise ValueError(f"reward.support_min_tokens must be >= 1, got {self.support_min_tokens}")
        if self.content_grounding not in CONTENT_GROUNDINGS:
            raise ValueError(
                f"reward.content_grounding must be one of {list(CONTENT_GROUNDINGS)}, got {self.content_grounding!r}"
            )
        if self.compression_gate not in COMPRESSION_GATES:
            raise ValueError(
                f"reward.compression_gate must be one of {list(COMPRESSION_GATES)}, got {self.compression_gate!r}"
            )
        if isinstance(self.content_judge_attempts, bool) or self.content_judge_attempts < 1:
            raise ValueError(f"reward.content_judge_attempts must be >= 1, got {self.content_judge_attempts}")
        if self.content_judge_temperature is not None and not self.content_judge_temperature >= 0:
            raise ValueError(
                f"reward.content_judge_temperature must be >= 0 (0 = greedy) or null, got {self.content_judge_temperature}"
            )
        if self.content_judge_max_tokens is not None and self.content_judge_max_tokens < 1:
            raise ValueError(f"reward.content_judge_max_tokens must be >= 1 or null, got {self.content_judge_max_tokens}")
        if self.content_judge_parse not in JUDGEMENT_PARSES:
            raise ValueError(
                f"reward.content_judge_parse must be one of {list(JUDGEMENT_PARSES)}, got {self.content_judge_parse!r}"
            )

    def build_content_judge(self, reader: Reader) -> ContentJudge:
        """The r4 judge: the rule checks, or ``reader`` asked for a validity judgement per call
        (with this group's attempts, sampling and parse)."""
        if self.content_judge == "rule":
            return RuleContentJudge()
        return LLMContentJudge(
            reader,
            attempts=self.content_judge_attempts,
            sampling=Sampling(self.content_judge_temperature, self.content_judge_max_tokens),
            parse=self.content_judge_parse,
        )


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

    def as_dict(self) -> dict[str, Any]:
        return {"r1": self.r1, "r3": self.r3, "r2": list(self.r2), "r4": list(self.r4), "total": list(self.total)}


class ContentJudge(Protocol):
    """Scores the content of parsed tool calls, one float in [0, 1] per call."""

    def judge(self, calls: Sequence[ToolCall]) -> list[float]: ...


# ---------------------------------------------------------------------------
# pure reward math
# ---------------------------------------------------------------------------


def accuracy_reward(question_scores: Sequence[float]) -> float:
    """r1: the mean question score (0 for an instance without questions)."""
    return float(sum(question_scores) / len(question_scores)) if question_scores else 0.0


def call_succeeded(result: ToolResult, rule: str = "status") -> bool:
    """Whether r2 counts ``result`` as a successful call under a rule that looks at the call alone
    (``status`` or ``official``; ``memalpha`` needs the turn's chunk: :func:`turn_call_successes`).

    ``status``: status ``ok`` or ``skipped``. ``official`` models what the official code
    reports for the same call, whose tools differ from memalpha's executor in three places:
    its insert of a text already stored reports ``skipped``, which it counts as a failure;
    its update to an unchanged text and its deletion of an empty core report success (memalpha:
    ``skipped``); and its deletion of a list item by an unknown or missing id deletes nothing
    and reports success (memalpha: an error). Every other error is a failure there too
    (updating an unknown id raises in the official store).
    """
    if rule == "status":
        return result.status in SUCCESS_STATUSES
    if rule != "official":
        raise ValueError(f"call_succeeded takes the rules 'status' and 'official', got {rule!r}")
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
    supports (:func:`memalpha.agent.grounding.is_supported`; an executed update is judged by what
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


def turn_call_successes(turn: TurnCalls, weights: RewardSettings) -> int:
    """The calls of ``turn`` that r2 counts as successful under ``weights.call_success``.

    ``memalpha``: a call succeeds when it changed the memory (status ``ok``) and, if it writes,
    its chunk supports what it writes; a deletion succeeds only in a turn where some call stored
    a supported text, and so does nothing else: a turn without one has no success at all.
    """
    rule = weights.call_success
    if rule != "memalpha":
        return sum(call_succeeded(r, rule) for r in turn.results)
    source = _chunk_source(turn, "reward.call_success: memalpha")
    changed = [r for r in turn.results if r.status == "ok" and r.call is not None]
    stored = [r for r in changed if supported_write(r, source, weights)]
    if not stored:
        return 0
    deletions = [r for r in changed if r.call.name == DELETE]
    return len(stored) + len(deletions)


def tool_success_reward(turn: TurnCalls, weights: RewardSettings | str | None = None) -> float:
    """r2_t: successful calls (:func:`turn_call_successes`) over all calls of the turn (parse
    errors are failed calls); 0 for a turn without calls. ``weights`` may be a rule's name alone
    (the support rule's thresholds then their defaults)."""
    if not isinstance(weights, RewardSettings):
        weights = RewardSettings() if weights is None else RewardSettings(call_success=weights)
    total = len(turn.results) + len(turn.parse_errors)
    if total == 0:
        return 0.0
    return turn_call_successes(turn, weights) / total


def compression_reward(memory_tokens: int, chunk_tokens: int) -> float:
    """r3 as the paper defines it: ``1 - memory_tokens / chunk_tokens``."""
    if chunk_tokens <= 0:
        raise ValueError(f"chunk_tokens must be > 0 to compute the compression reward, got {chunk_tokens}")
    return 1.0 - memory_tokens / chunk_tokens


def gated_compression(compression: float, accuracy: float, gate: str) -> float:
    """r3 under ``reward.compression_gate``: ``accuracy`` scales a positive compression by r1 (a
    negative one stays whole); ``none`` leaves it as it is."""
    if gate == "none" or compression < 0:
        return compression
    return accuracy * compression


def rollout_rewards(
    question_scores: Sequence[float],
    turns: Sequence[TurnCalls],
    memory_tokens: int,
    chunk_tokens: int,
    weights: RewardSettings,
    content_judge: ContentJudge | None,
) -> RolloutReward:
    """All components and ``R_t`` for one rollout (see the module docstring).

    The content judge sees every parsed call of the rollout in one batch. With
    ``weights.gamma == 0`` or no judge, r4 is reported as 0 without judging. Under
    ``content_grounding: chunk`` a call's verdict counts only when it writes a text its turn's
    chunk supports.
    """
    r1 = accuracy_reward(question_scores)
    r3 = gated_compression(compression_reward(memory_tokens, chunk_tokens), r1, weights.compression_gate)
    r2 = [tool_success_reward(t, weights) for t in turns]
    calls = [res.call for t in turns for res in t.results if res.call is not None]
    judging = content_judge is not None and weights.gamma != 0 and bool(calls)
    if judging:
        verdicts = list(content_judge.judge(calls))
        if len(verdicts) != len(calls):
            raise RuntimeError(f"content judge returned {len(verdicts)} scores for {len(calls)} calls")
    else:
        verdicts = [0.0] * len(calls)
    judged = iter(verdicts)
    r4: list[float] = []
    grounded = judging and weights.content_grounding == "chunk"
    for t in turns:
        source = _chunk_source(t, "reward.content_grounding: chunk") if grounded and t.results else frozenset()
        # a result without a call (nothing to judge) scores 0 but still counts in the mean
        turn_scores = []
        for res in t.results:
            if res.call is None:
                turn_scores.append(0.0)
                continue
            verdict = next(judged)
            turn_scores.append(verdict if not grounded or supported_write(res, source, weights) else 0.0)
        r4.append(sum(turn_scores) / len(turn_scores) if turn_scores else 0.0)
    total = [weights.accuracy_weight * r1 + a + weights.beta * r3 + weights.gamma * b for a, b in zip(r2, r4)]
    return RolloutReward(r1=r1, r3=r3, r2=r2, r4=r4, total=total)


# ---------------------------------------------------------------------------
# content judges
# ---------------------------------------------------------------------------


def call_content(call: ToolCall) -> tuple[str, str] | None:
    """``(memory kind, content)`` of an insert/update call — kind in core/semantic/episodic —
    or None for a deletion, an unknown tool, or a call without a known memory type."""
    args = call.arguments if isinstance(call.arguments, dict) else {}
    kind = str(args.get("memory_type", "")).strip().lower().removesuffix("_memory")
    if kind not in ("core", "semantic", "episodic"):
        return None
    if call.name == INSERT:
        content = args.get("content")
    elif call.name == UPDATE:
        content = args.get("new_content")
    else:
        return None
    return kind, content if isinstance(content, str) else ""


_WORDS = re.compile(r"[A-Za-z0-9]+")
_MONTHS = (
    "january|february|march|april|may|june|july|august|september|october|november|december|"
    "jan|feb|mar|apr|jun|jul|aug|sep|sept|oct|nov|dec"
)
_TIME_EXPRESSION = re.compile(
    r"\b\d{4}-\d{1,2}(-\d{1,2})?\b"  # 2024-01-05, 2024-01
    r"|\b\d{1,2}[/.]\d{1,2}[/.]\d{2,4}\b"  # 05/01/2024
    r"|\b\d{1,2}:\d{2}\b"  # 10:30
    r"|\b\d{1,2}\s*(am|pm|a\.m\.|p\.m\.)"  # 5 pm
    r"|\b(1[5-9]|20)\d{2}s?\b"  # a year
    rf"|\b({_MONTHS})\b"
    r"|\b(monday|tuesday|wednesday|thursday|friday|saturday|sunday|weekend|weekday)s?\b"
    r"|\b(today|yesterday|tomorrow|tonight|morning|afternoon|evening|night|noon|midnight)\b"
    r"|\b(day|week|month|year|hour|minute|decade|century)s?\s+(ago|later|before|after|earlier)\b"
    r"|\b(last|next|this|previous|following|every)\s+(day|week|month|year|time|weekend|night|morning|"
    r"evening|spring|summer|autumn|fall|winter|season)\b"
    r"|\b(spring|summer|autumn|winter)\b"
    r"|\b(when|after|before|during|since|until)\b"
    r"|\b(day|week|chapter|session|step|turn|time|t)\s*[=#]?\s*\d+\b",
    re.IGNORECASE,
)
_STAND_IN = re.compile(
    r"place[\s-]?holder|to be (filled|added|updated|determined)|\btbd\b|\bn/a\b|lorem ipsum|"
    r"goes here|(will be|to be) (saved|stored|summari[sz]ed|recorded)|here (we|i) (save|store|keep)|"
    r"\[(insert|add|summary|content)[^\]]*\]|<(summary|content|insert)[^>]*>|^(none|empty|nothing|\.\.\.)\.?$",
    re.IGNORECASE,
)
MIN_STATEMENT_WORDS = 3


def has_time_expression(text: str) -> bool:
    """True when ``text`` mentions a date, clock time, weekday/month, or a relative time."""
    return bool(_TIME_EXPRESSION.search(text))


def rule_validity(kind: str, content: str) -> tuple[bool, str]:
    """The rule judge's verdict on one content string, with the reason when it is invalid."""
    text = content.strip()
    if not text:
        return False, "empty content"
    if _STAND_IN.search(text):
        return False, "content is a stand-in, not information"
    if len(_WORDS.findall(text)) < MIN_STATEMENT_WORDS:
        return False, f"fewer than {MIN_STATEMENT_WORDS} words"
    if kind == "core" and "core memory" in text.lower():
        return False, "core talks about 'core memory' instead of holding content"
    if kind == "episodic" and not has_time_expression(text):
        return False, "episodic entry without a time expression"
    return True, ""


class RuleContentJudge:
    """Content validity by rules (see the module docstring); ``delete_score`` scores deletions."""

    def __init__(self, delete_score: float = 0.0) -> None:
        self.delete_score = float(delete_score)

    def judge(self, calls: Sequence[ToolCall]) -> list[float]:
        scores = []
        for call in calls:
            target = call_content(call)
            if target is None:
                scores.append(self.delete_score if call.name == DELETE else 0.0)
                continue
            valid, _reason = rule_validity(*target)
            scores.append(1.0 if valid else 0.0)
        return scores


_JSON_BLOCK = re.compile(r"```(?:json)?\s*(\{.*?\})\s*```", re.DOTALL)
_JSON_OBJECT = re.compile(r"\{.*\}", re.DOTALL)


def parse_validity_judgement(reply: str, parse: str = "memalpha") -> bool | None:
    """``VALID`` of a judge reply, or None when malformed.

    Well-formed means a JSON object with a boolean ``VALID``, a list ``ISSUES`` and a string
    ``EXPLANATION``, read under ``parse`` (``reward.content_judge_parse``): ``memalpha`` takes
    the first code fence's object, else the bare object, of the reply after any thinking block;
    ``official`` takes the first fenced object of the reply as it is, and only when the reply
    opens a fence tagged ``json`` anywhere (the official ``_validate_json_format``).
    """
    if parse not in JUDGEMENT_PARSES:
        raise ValueError(f"reward.content_judge_parse must be one of {list(JUDGEMENT_PARSES)}, got {parse!r}")
    if parse == "official":
        text = reply
        match = _JSON_BLOCK.search(text) if "```json" in text else None
    else:
        text = strip_thinking(reply)
        match = _JSON_BLOCK.search(text) or _JSON_OBJECT.search(text)
    if not match:
        return None
    try:
        data = json.loads(match.group(1) if match.re is _JSON_BLOCK else match.group(0))
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    valid, issues, explanation = data.get("VALID"), data.get("ISSUES"), data.get("EXPLANATION")
    if not isinstance(valid, bool) or not isinstance(issues, list) or not isinstance(explanation, str):
        return None
    return valid


class LLMContentJudge:
    """Content validity judged by a reader model (the paper's judge), one batched call per ask.

    Each write is one user message, or a system message (the kind's rules) and a user message
    (the entry) when the reader's templates define ``content_judge_system``, as the official
    judge sends them (:func:`memalpha.agent.prompts.content_judge_messages`).

    Calls without content (deletions) get ``delete_score`` without asking. A write whose reply
    is malformed (under ``parse``, see :func:`parse_validity_judgement`) or whose reader call
    failed is asked again, with the other such writes in one batch, until ``attempts`` asks in
    all; then it scores 0. Each ask after a malformed reply appends the templates'
    ``content_judge_retry`` to the user message once more (after a failed call the messages
    stay as they were), as the official per-call judge does. ``sampling`` (a
    :class:`~memalpha.reader.base.Sampling`) replaces the reader's temperature and reply length
    for the judge's requests.

    ``malformed`` counts every malformed reply and failed call, one per ask; ``unjudged`` counts
    the writes left without a well-formed judgement after their last ask (scored 0). With one
    attempt the two are equal.
    """

    def __init__(
        self,
        reader: Reader,
        delete_score: float = 0.0,
        attempts: int = 1,
        sampling: Sampling | None = None,
        parse: str = "memalpha",
    ) -> None:
        if attempts < 1:
            raise ValueError(f"content judge attempts must be >= 1, got {attempts}")
        if parse not in JUDGEMENT_PARSES:
            raise ValueError(f"content judge parse must be one of {list(JUDGEMENT_PARSES)}, got {parse!r}")
        self.reader = reader
        self.delete_score = float(delete_score)
        self.attempts = attempts
        self.sampling = sampling if sampling is not None and sampling.overrides else None
        self.parse = parse
        self.malformed = 0
        self.unjudged = 0

    def judge(self, calls: Sequence[ToolCall]) -> list[float]:
        scores = [0.0] * len(calls)
        asked: list[int] = []
        users: dict[int, str] = {}
        systems: dict[int, str | None] = {}
        templates = getattr(self.reader, "templates", None)
        for i, call in enumerate(calls):
            target = call_content(call)
            if target is None:
                scores[i] = self.delete_score if call.name == DELETE else 0.0
            elif not target[1].strip():
                scores[i] = 0.0
            else:
                asked.append(i)
                *system, user = content_judge_messages(*target, templates=templates)
                users[i] = user["content"]
                systems[i] = system[0]["content"] if system else None
        has_retry = templates is not None and templates.content_judge_retry is not None
        retry = templates.render("content_judge_retry") if has_retry else ""
        appended = dict.fromkeys(asked, 0)  # times the retry text is on each write's user message
        pending = asked
        for _ in range(self.attempts):
            if not pending:
                break
            replies = self._ask([users[i] + retry * appended[i] for i in pending], [systems[i] for i in pending])
            again = []
            for i, reply in zip(pending, replies):
                verdict = parse_validity_judgement(reply.text, self.parse) if reply.ok else None
                if verdict is None:
                    self.malformed += 1
                    if reply.ok:  # the official loop appends its text after a malformed reply, not a failed call
                        appended[i] += 1
                    again.append(i)
                else:
                    scores[i] = 1.0 if verdict else 0.0
            pending = again
        self.unjudged += len(pending)
        return scores

    def _ask(self, prompts: list[str], systems: list[str | None]):
        """One batch of judge requests: one user message each, or a system message (the rules)
        and the user message (the entry); the judge's sampling when it has its own."""
        options: dict[str, Any] = {}
        if any(s is not None for s in systems):
            options["systems"] = systems
        if self.sampling is not None:
            options["sampling"] = self.sampling
        return self.reader.complete(prompts, **options)
