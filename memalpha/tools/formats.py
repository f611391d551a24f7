"""Tool-call formats: the instructions each puts in the system prompt, and its parser.

Two formats (docs/method.md: memorising), chosen by name with :func:`get_call_format`:

``qwen``
    Qwen-Agent's function-call text, which the official Mem-α-4B model emits::

        ✿FUNCTION✿: new_memory_insert
        ✿ARGS✿: {"memory_type": "semantic_memory", "content": "..."}

    Several pairs may follow each other. Everything from the first ``✿RESULT✿``
    (or ``✿RETURN✿``) on is cut: that is where tool results or the final reply
    would start. Each ``✿FUNCTION✿`` marker yields exactly one call or one error.

``hermes``
    The native format of the Qwen2.5/Qwen3 chat templates::

        <tool_call>
        {"name": "new_memory_insert", "arguments": {"memory_type": "...", "content": "..."}}
        </tool_call>

    A block runs from ``<tool_call>`` to the next ``</tool_call>``, or to the next
    ``<tool_call>`` / the end of the text when the closing tag is missing. Each
    opening tag yields exactly one call or one error; a closing tag with no opening
    tag is reported as an error too.

A tool name that is not valid Unicode text (a lone surrogate) is a :class:`ParseError` with
``code="bad_name"``, and reasons quote names clipped, so every name and reason can be
written as UTF-8 and stays short.

Both parsers drop reasoning first: a complete ``<think>…</think>`` block, text
before a lone ``</think>`` (the template opened the block in the prompt), and
everything after an unclosed ``<think>``.

Where the trained part of a response ends (:meth:`CallFormat.trained_length`;
docs/metrics_and_rewards.md, "Trained tokens"): before the first token that reaches into the
format's :attr:`~CallFormat.result_marker` outside reasoning, a tool result the agent wrote itself:
``✿RESULT✿`` for ``qwen`` (``✿RETURN✿`` opens the agent's own closing reply, which the official
trainer trains too) and ``<tool_response>`` for ``hermes``. Only the training target ends there.

:meth:`CallFormat.parse` never raises on any text. How arguments are read is the call-repair
policy (``call_repair``, :data:`~memalpha.tools.jsonfix.CALL_REPAIRS`; docs/method.md, "Parsing",
and docs/official_compatibility.md, "Truncated and malformed calls"): ``strict`` (memalpha's
default) reads them with :func:`memalpha.tools.jsonfix.read_json_object` and makes arguments cut
off inside a string a :class:`ParseError` with ``code="truncated"`` and a call with no arguments an
error; ``json_repair`` (the official profile) reads them as the official code does and drops a call
with no arguments at all (a ``✿FUNCTION✿`` line with no ``✿ARGS✿``, an empty ``✿ARGS✿:`` that ends
the response, an empty ``<tool_call>`` block), which the official parser never sees; an empty
``✿ARGS✿:`` followed by another call stays an error, as the official decode fails on it.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from memalpha.templates.loader import PromptTemplates, default_templates
from memalpha.tools.jsonfix import STRICT, CallRepair
from memalpha.tools.schemas import TOOL_NAMES, TOOL_SCHEMAS, compact_signatures

_MEMALPHA = default_templates()  # memalpha's prompt texts, read now: parsing and rendering touch no file

FN_MARK = "✿FUNCTION✿"
ARGS_MARK = "✿ARGS✿"
RESULT_MARK = "✿RESULT✿"
RETURN_MARK = "✿RETURN✿"
CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
RESPONSE_OPEN = "<tool_response>"
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
_RAW_LIMIT = 2000  # characters of raw text kept on an error
_NAME_SHOWN = 80  # characters of a tool name quoted in an error's reason


@dataclass
class ToolCall:
    """One parsed call. ``raw`` is the response text it came from."""

    name: str
    arguments: dict[str, Any]
    raw: str
    repaired: bool = False
    repairs: list[str] = field(default_factory=list)


@dataclass
class ParseError:
    """A part of the response that looked like a call but could not be read as one."""

    reason: str
    raw: str
    code: str = "invalid"


@dataclass
class ParseResult:
    """All calls of one response, in order, and one error per malformed part."""

    calls: list[ToolCall] = field(default_factory=list)
    errors: list[ParseError] = field(default_factory=list)


def _spans_outside_thinking(text: str) -> list[tuple[int, int]]:
    """The ``(start, end)`` spans of ``text`` outside reasoning, in order
    (see :func:`text_outside_thinking`)."""
    spans: list[tuple[int, int]] = []
    pos = 0
    while True:
        opening = text.find(THINK_OPEN, pos)
        closing = text.find(THINK_CLOSE, pos)
        if closing >= 0 and (opening < 0 or closing < opening):
            spans.clear()  # everything so far was reasoning whose opening tag was in the prompt
            pos = closing + len(THINK_CLOSE)
            continue
        if opening < 0:
            spans.append((pos, len(text)))
            return spans
        spans.append((pos, opening))
        closing = text.find(THINK_CLOSE, opening + len(THINK_OPEN))
        if closing < 0:
            return spans
        pos = closing + len(THINK_CLOSE)


def text_outside_thinking(text: str) -> str:
    """Remove reasoning: ``<think>…</think>`` blocks, text before a lone ``</think>``, an open ``<think>``."""
    return "".join(text[start:end] for start, end in _spans_outside_thinking(text))


def _find_outside_thinking(text: str, marker: str) -> int | None:
    """Position in ``text`` of the first ``marker`` in what :func:`text_outside_thinking` keeps, or None.

    The search runs on the kept text, as the parsers read it, so a marker quoted in reasoning
    is not found; the position is mapped back into ``text``.
    """
    kept = [index for start, end in _spans_outside_thinking(text) for index in range(start, end)]
    found = "".join(text[index] for index in kept).find(marker)
    return None if found < 0 else kept[found]


def _common_prefix_length(first: str, second: str) -> int:
    """How many leading characters ``first`` and ``second`` share (no ``os.path``: tools import no I/O
    module)."""
    for index, (a, b) in enumerate(zip(first, second)):
        if a != b:
            return index
    return min(len(first), len(second))


def first_token_reaching(response_ids: Sequence[int], tokenizer, text: str, position: int) -> int:
    """Index of the first token of ``response_ids`` whose decoded bytes reach ``text[position:]``.

    ``text`` is ``tokenizer.decode(response_ids, skip_special_tokens=True)`` and ``position <
    len(text)``. A character may span several tokens (``✿`` is three bytes, often three
    tokens), and one token may hold the end of the text before ``position`` and the start of
    what follows (BPE merges across the boundary), so the tokens' text cannot be read one by
    one. Instead a prefix of the ids is decoded: it is a prefix of ``text``, possibly followed by
    replacement characters for a character whose bytes are incomplete, and it reaches
    ``position`` when it holds the character there or some of its bytes. That is monotone in
    the prefix length, so a binary search finds the first such prefix in ``log2(len)`` decodes.
    """

    def reaches(count: int) -> bool:
        prefix = tokenizer.decode(list(response_ids[:count]), skip_special_tokens=True)
        if text.startswith(prefix):
            return len(prefix) > position
        return _common_prefix_length(prefix, text) >= position  # incomplete bytes at the end

    below, above = 0, len(response_ids)  # reaches(below) is False, reaches(above) is True
    while above - below > 1:
        middle = (below + above) // 2
        if reaches(middle):
            above = middle
        else:
            below = middle
    return above - 1


def _clip(raw: str) -> str:
    return raw if len(raw) <= _RAW_LIMIT else raw[:_RAW_LIMIT] + f"... [{len(raw) - _RAW_LIMIT} more chars]"


def _label(name: str) -> str:
    """``name`` as a reason quotes it: clipped, so a reason stays short whatever the model wrote."""
    return name if len(name) <= _NAME_SHOWN else name[:_NAME_SHOWN] + "..."


def _name_not_text(name: str, raw: str) -> ParseError | None:
    """The error for a tool name that is not valid Unicode text (a lone surrogate, e.g. from ``"\\ud800"``).

    No tool has such a name, and refusing it here keeps every :class:`ToolCall` name and every
    reason writable as UTF-8: the rollout records both, and one unencodable character would
    fail the write of the whole validation report.
    """
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return ParseError(reason=f"tool name is not valid Unicode text: {name!r:.{_NAME_SHOWN}}",
                          raw=_clip(raw), code="bad_name")
    return None


def _arguments_call(name: str, args_text: str, raw: str, repair: CallRepair) -> ToolCall | ParseError:
    """Build a call from a name and its argument text, or the error explaining why not."""
    read = repair.read_arguments(args_text)
    if read.value is None:
        return ParseError(reason=f"{_label(name)}: {read.error}", raw=_clip(raw), code=read.code)
    return ToolCall(name=name, arguments=read.value, raw=raw, repaired=bool(read.repairs),
                    repairs=read.repairs)


def _argument_text(after_args_mark: str) -> str:
    """The argument text after a ``✿ARGS✿`` marker: without surrounding space and the marker's colon."""
    return after_args_mark.strip().removeprefix(":")


class CallFormat(ABC):
    """A way of writing tool calls: prompt instructions, rendering and parsing."""

    name: str = ""
    result_marker: str  # where a tool result would start; every format names one (module docstring)

    def result_start(self, text: str) -> int | None:
        """Where the agent's own turn ends in ``text``: its first :attr:`result_marker` outside
        reasoning, or None when it has none."""
        return _find_outside_thinking(text, self.result_marker)

    def trained_length(self, response_ids: Sequence[int], tokenizer) -> int:
        """How many leading tokens of a sampled response are trained (see the module docstring).

        All of them (the end-of-sequence token included) when the decoded response has no
        :attr:`result_marker` outside reasoning; otherwise the tokens before the first token
        that reaches into the marker (:func:`first_token_reaching`), so neither the marker nor
        anything after it is trained, even where BPE merged the marker's first bytes with the
        text before it (that text is then not trained either). Text is decoded without special
        tokens, as the rollout decodes the response it parses.
        """
        text = tokenizer.decode(list(response_ids), skip_special_tokens=True)
        start = self.result_start(text)
        if start is None:
            return len(response_ids)
        return first_token_reaching(response_ids, tokenizer, text, start)

    @abstractmethod
    def instructions(self, compact: bool = False, templates: PromptTemplates | None = None) -> str:
        """The tool block for the system prompt: the format's ``tool_block_*`` template
        (:mod:`memalpha.templates`; ``None``: memalpha's) around the tools generated from
        :data:`TOOL_SCHEMAS`; ``compact`` lists one signature line per tool instead of the JSON
        schemas (for small models)."""

    @abstractmethod
    def render_call(self, name: str, arguments: dict[str, Any]) -> str:
        """One call written in this format."""

    def parse(self, text: str, repair: CallRepair = STRICT) -> ParseResult:
        """All calls in ``text`` (after a leading thinking block) and an error for each malformed one,
        read under the call-repair policy ``repair`` (module docstring). Never raises on any text."""
        result = ParseResult()
        if not isinstance(text, str):
            result.errors.append(
                ParseError(reason="response is not text", raw=_clip(repr(text)), code="not_text")
            )
            return result
        return self._parse_text(text_outside_thinking(text), result, repair)

    @abstractmethod
    def _parse_text(self, text: str, result: ParseResult, repair: CallRepair) -> ParseResult:
        """Add the calls and errors of ``text`` (a string, thinking removed) to ``result`` and return it."""

    def render_calls(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        """Several calls, one after another."""
        return "\n".join(self.render_call(name, arguments) for name, arguments in calls)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


def _tools_json_lines() -> str:
    return "\n".join(json.dumps(schema, ensure_ascii=False) for schema in TOOL_SCHEMAS)


class QwenFormat(CallFormat):
    """``✿FUNCTION✿: name`` / ``✿ARGS✿: {json}`` pairs (Qwen-Agent; the official Mem-α-4B)."""

    name = "qwen"
    result_marker = RESULT_MARK

    def instructions(self, compact: bool = False, templates: PromptTemplates | None = None) -> str:
        listing = compact_signatures() if compact else _tools_json_lines()
        return (templates or _MEMALPHA).render(
            "tool_block_qwen", tools=listing, tool_names=", ".join(TOOL_NAMES)
        )

    def render_call(self, name: str, arguments: dict[str, Any]) -> str:
        return f"{FN_MARK}: {name}\n{ARGS_MARK}: {json.dumps(arguments, ensure_ascii=False)}"

    def _parse_text(self, text: str, result: ParseResult, repair: CallRepair) -> ParseResult:
        for mark in (RESULT_MARK, RETURN_MARK):
            cut = text.find(mark)
            if cut >= 0:
                text = text[:cut]
        starts: list[int] = []
        pos = text.find(FN_MARK)
        while pos >= 0:
            starts.append(pos)
            pos = text.find(FN_MARK, pos + len(FN_MARK))
        preamble = text[: starts[0]] if starts else text
        stray = preamble.find(ARGS_MARK)
        if stray >= 0:
            result.errors.append(ParseError(reason=f"{ARGS_MARK} without a {FN_MARK} line before it",
                                            raw=_clip(preamble[stray:]), code="missing_name"))
        for index, start in enumerate(starts):
            end = starts[index + 1] if index + 1 < len(starts) else len(text)
            outcome = self._parse_segment(text[start:end], repair, last=end == len(text))
            if outcome is not None:
                (result.calls if isinstance(outcome, ToolCall) else result.errors).append(outcome)
        return result

    @staticmethod
    def _parse_segment(segment: str, repair: CallRepair, last: bool) -> ToolCall | ParseError | None:
        """The call or error of one ``✿FUNCTION✿`` segment; None for a call the official policy drops
        (no arguments; ``last``: the segment ends the response)."""
        body = segment[len(FN_MARK):]
        split = body.find(ARGS_MARK)
        no_arguments = split < 0 or (last and not _argument_text(body[split + len(ARGS_MARK):]).strip())
        if repair.drops_calls_without_arguments and no_arguments:
            return None
        head = body if split < 0 else body[:split]
        name = head.strip().removeprefix(":").strip()
        if not name:
            return ParseError(reason=f"{FN_MARK} without a tool name", raw=_clip(segment),
                              code="missing_name")
        if any(ch.isspace() for ch in name):
            return ParseError(reason=f"tool name must be one word, got {name[:80]!r}", raw=_clip(segment),
                              code="bad_name")
        problem = _name_not_text(name, segment)
        if problem:
            return problem
        if split < 0:
            return ParseError(reason=f"{_label(name)}: no {ARGS_MARK} line after the tool name (cut off?)",
                              raw=_clip(segment), code="missing_args")
        args_text = body[split + len(ARGS_MARK):]
        if ARGS_MARK in args_text:
            return ParseError(reason=f"{_label(name)}: several {ARGS_MARK} lines for one {FN_MARK}",
                              raw=_clip(segment), code="duplicate_args")
        args_text = _argument_text(args_text)
        if not args_text.strip():
            return ParseError(reason=f"{_label(name)}: {ARGS_MARK} is empty (the response may have been "
                              "cut off)", raw=_clip(segment), code="missing_args")
        return _arguments_call(name, args_text, segment, repair)


class HermesFormat(CallFormat):
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks (Qwen2.5/Qwen3 native)."""

    name = "hermes"
    result_marker = RESPONSE_OPEN

    def instructions(self, compact: bool = False, templates: PromptTemplates | None = None) -> str:
        t = templates or _MEMALPHA
        if compact:
            return t.render("tool_block_hermes_compact", tools=compact_signatures())
        return t.render("tool_block_hermes", tools=_tools_json_lines())

    def render_call(self, name: str, arguments: dict[str, Any]) -> str:
        payload = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
        return f"{CALL_OPEN}\n{payload}\n{CALL_CLOSE}"

    def _parse_text(self, text: str, result: ParseResult, repair: CallRepair) -> ParseResult:
        pos = 0
        while True:
            opening = text.find(CALL_OPEN, pos)
            closing = text.find(CALL_CLOSE, pos)
            if closing >= 0 and (opening < 0 or closing < opening):
                result.errors.append(ParseError(reason=f"{CALL_CLOSE} without an opening {CALL_OPEN}",
                                                raw=_clip(text[pos : closing + len(CALL_CLOSE)]),
                                                code="unbalanced_tags"))
                pos = closing + len(CALL_CLOSE)
                continue
            if opening < 0:
                return result
            start = opening + len(CALL_OPEN)
            next_open = text.find(CALL_OPEN, start)
            next_close = text.find(CALL_CLOSE, start)
            if next_close >= 0 and (next_open < 0 or next_close < next_open):
                body, pos = text[start:next_close], next_close + len(CALL_CLOSE)
            else:
                pos = next_open if next_open >= 0 else len(text)
                body = text[start:pos]
            if repair.drops_calls_without_arguments and not body.strip():
                continue  # a call with no arguments: the official policy drops it (module docstring)
            outcome = self._parse_block(body, text[opening:pos], repair)
            (result.calls if isinstance(outcome, ToolCall) else result.errors).append(outcome)

    @staticmethod
    def _parse_block(body: str, raw: str, repair: CallRepair) -> ToolCall | ParseError:
        read = repair.read_arguments(body)
        if read.value is None:
            return ParseError(reason=f"tool call: {read.error}", raw=_clip(raw), code=read.code)
        payload = read.value
        name = payload.get("name")
        if not isinstance(name, str) or not name.strip():
            return ParseError(reason='tool call has no "name" string', raw=_clip(raw), code="missing_name")
        name = name.strip()
        problem = _name_not_text(name, raw)
        if problem:
            return problem
        if "arguments" not in payload:
            return ParseError(reason=f'{_label(name)}: tool call has no "arguments"', raw=_clip(raw),
                              code="missing_args")
        arguments = payload["arguments"]
        repairs = list(read.repairs)
        if isinstance(arguments, str):  # arguments sent as a JSON string
            inner = repair.read_arguments(arguments)
            if inner.value is None:
                return ParseError(reason=f"{_label(name)}: {inner.error}", raw=_clip(raw), code=inner.code)
            arguments = inner.value
            repairs += ["decoded arguments given as a JSON string"] + inner.repairs
        if not isinstance(arguments, dict):
            kind = type(arguments).__name__
            return ParseError(reason=f'{_label(name)}: "arguments" must be a JSON object, got {kind}',
                              raw=_clip(raw), code="not_object")
        return ToolCall(name=name, arguments=arguments, raw=raw, repaired=bool(repairs), repairs=repairs)


CallFormatName = Literal["qwen", "hermes"]
"""The call formats' names, the keys of :data:`CALL_FORMATS` (tests check they agree)."""
CALL_FORMATS: dict[str, CallFormat] = {"qwen": QwenFormat(), "hermes": HermesFormat()}


def get_call_format(name: str) -> CallFormat:
    """The call format called ``name`` (``"qwen"`` or ``"hermes"``)."""
    try:
        return CALL_FORMATS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown call format {name!r}; choose one of {sorted(CALL_FORMATS)}") from None
