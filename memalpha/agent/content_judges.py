"""The content-validity judges of reward r4 (docs/metrics_and_rewards.md): one score in [0, 1] per call.

* :class:`RuleContentJudge` (default, free): deterministic checks by memory kind
  (:func:`rule_validity`);
* :class:`LLMContentJudge`: the paper's judgement through a reader, which answers with a
  JSON object ``{"VALID": bool, "ISSUES": [...], "EXPLANATION": str}``.

As in the official code, deletions carry no content and score 0, and calls are judged by
their arguments whether or not they executed.

The judges take typed values and check none of them: their settings are checked once, where
they enter, by :class:`memalpha.agent.reward_settings.RewardSettings`, which builds the judge
(:meth:`~memalpha.agent.reward_settings.RewardSettings.build_content_judge`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol, get_args

from memalpha.agent.answer_metrics import reply_after_thinking
from memalpha.agent.memorise_prompts import content_judge_messages
from memalpha.tools.schemas import INSERT, UPDATE

if TYPE_CHECKING:
    from memalpha.reader.base import Reader, ReaderSampling
    from memalpha.tools.formats import ToolCall

JudgementParse = Literal["memalpha", "official"]
"""Which judge replies are well-formed (``reward.content_judge_parse``)."""
JUDGEMENT_PARSES: tuple[str, ...] = get_args(JudgementParse)


class ContentJudge(Protocol):
    """Scores the content of parsed tool calls, one float in [0, 1] per call."""

    def judge(self, calls: Sequence[ToolCall]) -> list[float]: ...


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


# ---------------------------------------------------------------------------
# the rule judge
# ---------------------------------------------------------------------------

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
    r"\[(insert|add|summary|content)[^\]]*\]|<(summary|content|insert)[^>]*>"
    r"|^(none|empty|nothing|\.\.\.)\.?$",
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
    """Content validity by rules (see the module docstring)."""

    def judge(self, calls: Sequence[ToolCall]) -> list[float]:
        scores = []
        for call in calls:
            target = call_content(call)
            scores.append(1.0 if target is not None and rule_validity(*target)[0] else 0.0)
        return scores


# ---------------------------------------------------------------------------
# the LLM judge
# ---------------------------------------------------------------------------

_JSON_BLOCK = re.compile(r"```(?:json)?\s*(\{.*?\})\s*```", re.DOTALL)
_JSON_OBJECT = re.compile(r"\{.*\}", re.DOTALL)


def _memalpha_object(reply: str) -> str | None:
    """The first fenced object, else the bare object, of ``reply`` after any thinking block."""
    text = reply_after_thinking(reply)
    fenced = _JSON_BLOCK.search(text)
    if fenced:
        return fenced.group(1)
    bare = _JSON_OBJECT.search(text)
    return bare.group(0) if bare else None


def _official_object(reply: str) -> str | None:
    """The first fenced object of ``reply`` as it is, only when it opens a fence tagged ``json``
    anywhere (the official ``_validate_json_format``)."""
    fenced = _JSON_BLOCK.search(reply) if "```json" in reply else None
    return fenced.group(1) if fenced else None


JUDGEMENT_OBJECTS: dict[str, Callable[[str], str | None]] = {
    "memalpha": _memalpha_object,
    "official": _official_object,
}
"""The JSON text each parse reads from a judge reply; its keys are :data:`JUDGEMENT_PARSES`."""


def parse_validity_judgement(
    reply: str, find_object: Callable[[str], str | None] = _memalpha_object
) -> bool | None:
    """``VALID`` of a judge reply, or None when malformed.

    Well-formed means a JSON object with a boolean ``VALID``, a list ``ISSUES`` and a string
    ``EXPLANATION``, found by ``find_object`` (``reward.content_judge_parse``'s entry of
    :data:`JUDGEMENT_OBJECTS`, picked once when the judge is built): ``memalpha`` takes
    the first code fence's object, else the bare object, of the reply after any thinking block;
    ``official`` takes the first fenced object of the reply as it is, and only when the reply
    opens a fence tagged ``json`` anywhere (the official ``_validate_json_format``).
    """
    found = find_object(reply)
    if found is None:
        return None
    try:
        data = json.loads(found)
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
    judge sends them (:func:`memalpha.agent.memorise_prompts.content_judge_messages`).

    Calls without content (deletions) score 0 without asking. A write whose reply
    is malformed (under ``parse``, see :func:`parse_validity_judgement`) or whose reader call
    failed is asked again, with the other such writes in one batch, until ``attempts`` asks in
    all (``attempts`` >= 1); then it scores 0. Each ask after a malformed reply appends the
    templates' ``content_judge_retry`` to the user message once more (after a failed call the
    messages stay as they were), as the official per-call judge does. ``sampling`` (a
    :class:`~memalpha.reader.base.ReaderSampling`) replaces the reader's temperature and reply length
    for the judge's requests.

    ``malformed`` counts every malformed reply and failed call, one per ask; ``unjudged`` counts
    the writes left without a well-formed judgement after their last ask (scored 0). With one
    attempt the two are equal.
    """

    def __init__(
        self,
        reader: Reader,
        attempts: int = 1,
        sampling: ReaderSampling | None = None,
        parse: JudgementParse = "memalpha",
    ) -> None:
        self.reader = reader
        self.attempts = attempts
        self.sampling = sampling if sampling is not None and sampling.overrides else None
        self.find_object = JUDGEMENT_OBJECTS[parse]
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
            if target is not None and target[1].strip():
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
            prompts = [users[i] + retry * appended[i] for i in pending]
            replies = self._ask(prompts, [systems[i] for i in pending])
            again = []
            for i, reply in zip(pending, replies):
                verdict = parse_validity_judgement(reply.text, self.find_object) if reply.ok else None
                if verdict is None:
                    self.malformed += 1
                    # the official loop appends its text after a malformed reply, not a failed call
                    if reply.ok:
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
