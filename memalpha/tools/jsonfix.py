"""Tolerant reading of one JSON object from model text, with light, reported repairs.

:func:`read_json_object` first tries the standard decoder. If that fails it runs one
linear, string-aware pass that fixes only these slips and lists every fix it made:

* single-quoted strings (``{'a': 'b'}``) become double-quoted,
* raw control characters (e.g. a literal newline) inside strings are escaped,
* ``\\'`` (not a JSON escape) becomes a plain apostrophe,
* trailing commas before ``}`` / ``]`` are dropped,
* closing brackets missing at the end of the text are added.

Text that ends *inside a string* is never repaired: the content was cut off
mid-sentence (the model hit its length limit), and any "repair" would store a
silently shortened value. Such text yields ``error`` with the code
``"truncated"``. Nothing is ever evaluated as code.

That is the ``strict`` call-repair policy, memalpha's default. The ``json_repair`` policy
(:data:`JSON_REPAIR`, ``rollout.call_repair``; the official profile) reads arguments as the
official Mem-α code does, with :func:`repair_object_as_official`: whatever the ``json-repair``
package makes of them, a cut-off string included. That package only parses the string it is
given (its file readers are never called here), so the sandbox holds under both policies.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from json_repair import repair_json  # a pure string parser here: no file, network or eval (see above)

CallRepairName = Literal["strict", "json_repair"]
"""``rollout.call_repair``: memalpha's policy (cut-off arguments refused) or the official code's."""
_REPAIRED_BY_PACKAGE = "repaired with json-repair (the official policy)"

_DECODER = json.JSONDecoder()
_CLOSERS = {"{": "}", "[": "]"}
_CONTROL_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f"}


@dataclass
class JsonRead:
    """Outcome of :func:`read_json_object`: ``value`` or an ``error`` (with a short ``code``)."""

    value: dict[str, Any] | None = None
    repairs: list[str] = field(default_factory=list)
    error: str = ""
    code: str = ""


def strip_code_fence(text: str) -> str:
    """Remove a surrounding Markdown code fence (```json ... ```) if there is one."""
    stripped = text.strip()
    if not stripped.startswith("```"):
        return stripped
    newline = stripped.find("\n")
    body = stripped[newline + 1 :] if newline >= 0 else ""
    if body.rstrip().endswith("```"):
        body = body.rstrip()[:-3]
    return body.strip()


def read_json_object(text: str) -> JsonRead:
    """Read the JSON object at the start of ``text`` (surrounding whitespace and fences allowed).

    Text after the object's closing brace is ignored. Never raises.
    """
    body = strip_code_fence(text)
    if not body:
        return JsonRead(error="no arguments given", code="empty")
    if body[0] != "{":
        return JsonRead(error=f"arguments must be a JSON object starting with '{{', got {body[:40]!r}",
                        code="not_object")
    try:
        value, _ = _DECODER.raw_decode(body)
    except (ValueError, RecursionError) as exc:
        first_error = str(exc)[:200] if not isinstance(exc, RecursionError) else "nesting too deep"
    else:
        return JsonRead(value=value) if isinstance(value, dict) else JsonRead(
            error="arguments are not a JSON object", code="not_object")
    fixed, repairs, problem, code = _repair(body)
    if problem:
        return JsonRead(error=problem, code=code)
    try:
        value = json.loads(fixed)
    except (ValueError, RecursionError):
        return JsonRead(error=f"invalid JSON: {first_error}", code="invalid_json")
    if not isinstance(value, dict):
        return JsonRead(error="arguments are not a JSON object", code="not_object")
    return JsonRead(value=value, repairs=repairs)


def trim_after_last_brace(text: str) -> str:
    """``text`` stripped and, when it opens with ``{``, cut after its last ``}``.

    The official code trims argument text this way before repairing it; a cut-off call whose
    content holds a ``}`` therefore loses everything after that brace, and matching that is what
    makes the stored prefixes equal the official ones.
    """
    text = text.strip()
    if text.startswith("{"):
        end = text.rfind("}")
        if end > 0:
            return text[: end + 1]
    return text


def repair_object_as_official(text: str) -> JsonRead:
    """Read ``text`` as the official code does: trim (:func:`trim_after_last_brace`), repair with
    ``json-repair``, decode. Never raises.

    Unlike :func:`read_json_object`, text cut off inside a string is read as the prefix the
    package keeps, and a code fence is not removed. A result that is not an object (the package
    turns empty text into ``""``, other text into a string or list) is an error, as it is there.
    Any exception of the package counts as invalid JSON: it parses model-written text, and one
    malformed call must never end a rollout.
    """
    body = trim_after_last_brace(text)
    if not body:
        return JsonRead(error="no arguments given", code="empty")
    try:
        value = json.loads(body)
        repairs: list[str] = []
    except (ValueError, RecursionError):
        try:
            value = json.loads(repair_json(body))
        except Exception as exc:  # noqa: BLE001 - only the package and json.loads run on the model's
            # text here: its failure means this text cannot be read, a failed call, never a memalpha fault
            return JsonRead(
                error=f"invalid JSON even after json-repair: {type(exc).__name__}", code="invalid_json"
            )
        repairs = [_REPAIRED_BY_PACKAGE]
    if not isinstance(value, dict):
        return JsonRead(error="arguments are not a JSON object", code="not_object")
    return JsonRead(value=value, repairs=repairs)


@dataclass(frozen=True)
class CallRepair:
    """A call-repair policy (``rollout.call_repair``), picked once from the setting's name
    (:data:`CALL_REPAIRS`): how a call's argument text is read, whether a call with no argument
    text is dropped rather than reported, and whether arguments the tool does not take are
    ignored rather than refused."""

    name: str
    read_arguments: Callable[[str], JsonRead]
    drops_calls_without_arguments: bool
    ignores_extra_arguments: bool


STRICT = CallRepair(
    "strict", read_json_object, drops_calls_without_arguments=False, ignores_extra_arguments=False
)
"""memalpha's policy: light, reported repairs (:func:`read_json_object`); cut-off arguments refused."""
JSON_REPAIR = CallRepair(
    "json_repair", repair_object_as_official, drops_calls_without_arguments=True, ignores_extra_arguments=True
)
"""The official code's policy (:func:`repair_object_as_official`)."""
CALL_REPAIRS: dict[str, CallRepair] = {policy.name: policy for policy in (STRICT, JSON_REPAIR)}
"""Each ``rollout.call_repair`` name's policy."""


# Why the strict policy keeps its own pass instead of the json-repair package (which the
# json_repair policy above uses): the package turns any text into a value and cannot refuse,
# and refusing is this policy's job. It closes a string cut off by the token limit
# ('{"content": "cut off' -> {"content": "cut off"}), gives a dangling key a value
# ('{"a":' -> {"a": ""}), and accepts what is not JSON at all ('{"a" "b"}' -> {"a": "b"},
# '{"a": tru}' -> {"a": "tru"}); its log names no repair for single quotes, trailing commas or
# missing brackets, so ToolCall.repairs could not say what changed. Built on it, the default
# profile's 11 recorded cut-off calls would no longer fail as truncated: one stores its cut prefix
# as a success, ten fail on the keys the package made up (69 of the 80 calls succeed, not 68).
# tests/test_call_repair.py pins both readings and these package behaviours.
def _repair(body: str) -> tuple[str, list[str], str, str]:
    """One pass over ``body``; returns (fixed text, repairs, problem, problem code)."""
    out: list[str] = []
    repairs: list[str] = []
    stack: list[str] = []
    quote = ""  # the open string's quote character, "" outside strings
    i = 0
    n = len(body)
    while i < n:
        ch = body[i]
        if quote:
            if ch == "\\":
                if i + 1 >= n:
                    break  # ends in an escape: inside a string, handled below
                nxt = body[i + 1]
                if nxt == "'":  # \' is not a JSON escape
                    out.append("'")
                    if quote == '"':
                        _note(repairs, "removed invalid escapes")
                else:
                    out.append(ch + nxt)
                i += 2
                continue
            if ch == quote:
                out.append('"')
                quote = ""
            elif ch == '"':  # a double quote inside a single-quoted string
                out.append('\\"')
            elif ch in _CONTROL_ESCAPES or ord(ch) < 0x20:
                out.append(_CONTROL_ESCAPES.get(ch, f"\\u{ord(ch):04x}"))
                _note(repairs, "escaped control characters inside strings")
            else:
                out.append(ch)
            i += 1
            continue
        if ch in "\"'":
            if ch == "'":
                _note(repairs, "replaced single quotes with double quotes")
            quote = ch
            out.append('"')
        elif ch in _CLOSERS:
            stack.append(_CLOSERS[ch])
            out.append(ch)
        elif ch in "}]":
            if not stack or stack[-1] != ch:
                return "", repairs, f"unbalanced {ch!r} at character {i}", "invalid_json"
            _drop_trailing_comma(out, repairs)
            stack.pop()
            out.append(ch)
            if not stack:
                return "".join(out), repairs, "", ""  # object complete; ignore what follows
        else:
            out.append(ch)
        i += 1
    if quote:
        return "", repairs, (
            "arguments end inside a string: the call was cut off (truncated) before its JSON closed"
        ), "truncated"
    _drop_trailing_comma(out, repairs)
    tail = "".join(out).rstrip()
    if tail.endswith(":"):
        return "", repairs, "arguments end after a key with no value: the call was cut off (truncated)", \
            "truncated"
    out = [tail]
    out.append("".join(reversed(stack)))
    _note(repairs, f"added {len(stack)} missing closing bracket(s) at the end")
    return "".join(out), repairs, "", ""


def _drop_trailing_comma(out: list[str], repairs: list[str]) -> None:
    """Remove a ',' (and the whitespace after it) from the end of ``out``."""
    j = len(out) - 1
    while j >= 0 and out[j].isspace():
        j -= 1
    if j >= 0 and out[j] == ",":
        del out[j:]
        _note(repairs, "removed trailing commas")


def _note(repairs: list[str], message: str) -> None:
    if message not in repairs:
        repairs.append(message)
