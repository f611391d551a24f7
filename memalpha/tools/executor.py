"""Apply one parsed tool call to a :class:`~memalpha.memory.store.Memory`.

:func:`execute_call` validates the call against :data:`TOOL_SCHEMAS` and then uses
only the memory's own methods: a tool can change nothing but the memory object it
is given (no globals, no I/O, the call's ``arguments`` are not modified).
It never raises on bad calls; it returns a :class:`ToolResult` whose ``status`` is

* ``"ok"`` – the memory changed,
* ``"skipped"`` – nothing to do: the identical content is already there (insert of
  an existing text, update to the same text, delete of an already empty core),
* ``"error"`` – with a ``reason`` and a ``code``: ``unknown_tool``, ``not_object``,
  ``missing_argument``, ``extra_argument``, ``wrong_type``, ``bad_memory_type``,
  ``insert_into_core``, ``unknown_id``, ``empty_content``, ``invalid_text``.

A reason quotes model-written names, keys and values only clipped (to 40-200 characters,
``repr``-escaped), so it stays one short line of valid text whatever the call holds: the
rollout records every reason, and a 10 MB key must not become a 10 MB reason.

A rollout turn's calls are its parsed calls plus the parse errors of its response, each
:class:`~memalpha.tools.formats.ParseError` one failed call; which executed calls succeed is
``reward.call_success`` (:func:`memalpha.agent.reward_math.turn_call_successes`), the same executor
under every rule. Where it differs from the official executor on purpose (unknown ids, skipped
no-ops, truncated calls refused under the ``strict`` call-repair policy, extra arguments dropped
under ``json_repair`` by :func:`drop_extra_arguments`) is listed in docs/metrics_and_rewards.md
("Tool execution: deliberate differences") and docs/official_compatibility.md ("Truncated and
malformed calls").
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from memalpha.memory.store import CORE, LIST_TYPES, Memory
from memalpha.tools.formats import CallFormat, ParseResult, ToolCall
from memalpha.tools.jsonfix import STRICT, CallRepair
from memalpha.tools.schemas import DELETE, INSERT, TOOL_NAMES, UPDATE, tool_parameters

if TYPE_CHECKING:
    from memalpha.tools.formats import ParseError

SUCCESS_STATUSES = frozenset({"ok", "skipped"})


@dataclass
class ToolResult:
    """Outcome of one call: ``status`` is ``ok``, ``skipped`` or ``error``."""

    status: str
    reason: str
    call: ToolCall | None
    code: str = ""
    memory_id: str | None = None
    replaced: str | None = None
    """The text an ``ok`` update overwrote (the old core or entry), for the reward's support rule."""

    @property
    def success(self) -> bool:
        """True for ``ok`` and ``skipped`` (what r2 counts as a successful call under memalpha's rule)."""
        return self.status in SUCCESS_STATUSES


def _error(call: ToolCall | None, code: str, reason: str) -> ToolResult:
    return ToolResult(status="error", reason=reason, call=call, code=code)


def _check_arguments(call: ToolCall) -> ToolResult | None:
    """Schema checks: known tool, object, no extra or missing keys, string types, enums."""
    if call.name not in TOOL_NAMES:
        return _error(call, "unknown_tool", f"unknown tool {call.name!r:.80}; tools are {list(TOOL_NAMES)}")
    if not isinstance(call.arguments, dict):
        return _error(call, "not_object", f"{call.name}: arguments must be a JSON object")
    params = tool_parameters(call.name)
    properties = params["properties"]
    extra = sorted((key for key in call.arguments if key not in properties), key=repr)  # keys of any type
    if extra:
        return _error(call, "extra_argument",
                      f"{call.name}: unexpected argument(s) {extra!r:.200}; allowed are {sorted(properties)}")
    memory_type = call.arguments.get("memory_type")
    if call.name == INSERT and memory_type == CORE:
        return _error(call, "insert_into_core",
                      f"{INSERT} cannot write core_memory; use {UPDATE} to rewrite the core")
    missing = [key for key in params["required"] if key not in call.arguments]
    if missing:
        return _error(call, "missing_argument", f"{call.name}: missing argument(s) {missing}")
    for key, value in call.arguments.items():
        if not isinstance(value, str):
            return _error(call, "wrong_type",
                          f"{call.name}: argument {key!r} must be a string, got {type(value).__name__}")
    allowed = properties["memory_type"]["enum"]
    if memory_type not in allowed:
        return _error(call, "bad_memory_type",
                      f"{call.name}: memory_type must be one of {allowed}, got {memory_type!r:.80}")
    return None


def _check_text(call: ToolCall, text: str) -> ToolResult | None:
    if not text.strip():
        return _error(call, "empty_content", f"{call.name}: content is empty")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return _error(call, "invalid_text", f"{call.name}: content is not valid Unicode text")
    return None


def _id_or_error(call: ToolCall, memory: Memory, memory_type: str) -> tuple[str, ToolResult | None]:
    memory_id = call.arguments.get("memory_id")
    if memory_id is None:
        return "", _error(call, "missing_argument", f"{call.name}: memory_id is required for {memory_type}")
    if memory.find(memory_type, memory_id) is None:
        other = next(t for t in LIST_TYPES if t != memory_type)
        hint = f" (it is in {other})" if memory.find(other, memory_id) is not None else ""
        return "", _error(
            call, "unknown_id", f"{call.name}: no {memory_type} item with id {memory_id!r:.40}{hint}"
        )
    return memory_id, None


def _insert(memory: Memory, call: ToolCall) -> ToolResult:
    memory_type, content = call.arguments["memory_type"], call.arguments["content"]
    problem = _check_text(call, content)
    if problem:
        return problem
    entry = memory.insert(memory_type, content)
    if entry is None:
        existing = memory.find_content(memory_type, content)
        return ToolResult("skipped", f"identical content already in {memory_type}", call,
                          memory_id=existing.id if existing else None)
    return ToolResult("ok", f"inserted into {memory_type} as [{entry.id}]", call, memory_id=entry.id)


def _update(memory: Memory, call: ToolCall) -> ToolResult:
    memory_type, content = call.arguments["memory_type"], call.arguments["new_content"]
    problem = _check_text(call, content)
    if problem:
        return problem
    if memory_type == CORE:
        if memory.core == content:
            return ToolResult("skipped", "core_memory already holds this text", call)
        old = memory.core
        truncated = memory.set_core(content)
        note = f" (cut to {memory.core_token_limit} tokens)" if truncated else ""
        return ToolResult("ok", f"core_memory replaced{note}", call, replaced=old)
    memory_id, problem = _id_or_error(call, memory, memory_type)
    if problem:
        return problem
    same = memory.find_content(memory_type, content)
    if same is not None:
        where = "this item" if same.id == memory_id else f"item [{same.id}]"
        return ToolResult("skipped", f"identical content already in {where} of {memory_type}", call,
                          memory_id=memory_id)
    old = memory.find(memory_type, memory_id).content
    memory.update(memory_type, memory_id, content)
    return ToolResult(
        "ok", f"updated [{memory_id}] in {memory_type}", call, memory_id=memory_id, replaced=old
    )


def _delete(memory: Memory, call: ToolCall) -> ToolResult:
    memory_type = call.arguments["memory_type"]
    if memory_type == CORE:
        if not memory.core:
            return ToolResult("skipped", "core_memory is already empty", call)
        memory.clear_core()
        return ToolResult("ok", "core_memory emptied", call)
    memory_id, problem = _id_or_error(call, memory, memory_type)
    if problem:
        return problem
    memory.delete(memory_type, memory_id)
    return ToolResult("ok", f"deleted [{memory_id}] from {memory_type}", call, memory_id=memory_id)


_HANDLERS = {INSERT: _insert, UPDATE: _update, DELETE: _delete}


def drop_extra_arguments(call: ToolCall) -> ToolCall:
    """``call`` without the arguments its tool does not take (a copy; ``call`` is not modified).

    The ``json_repair`` policy's reading of a call, as the official tools read only the keys they
    know. A call of an unknown tool, or with arguments that are not an object, is returned as
    it is, for the checks to refuse.
    """
    if call.name not in TOOL_NAMES or not isinstance(call.arguments, dict):
        return call
    properties = tool_parameters(call.name)["properties"]
    kept = {key: value for key, value in call.arguments.items() if key in properties}
    return call if len(kept) == len(call.arguments) else replace(call, arguments=kept)


def execute_call(memory: Memory, call: ToolCall, repair: CallRepair = STRICT) -> ToolResult:
    """Validate ``call`` and apply it to ``memory``; never raises on a bad call.

    Under a call-repair policy that ignores extra arguments (``json_repair``) arguments the tool does
    not take are dropped (:func:`drop_extra_arguments`); under ``strict`` they make the call an
    ``extra_argument`` error.
    """
    if not isinstance(call, ToolCall):
        return _error(None, "not_object", f"not a ToolCall: {type(call).__name__}")
    if repair.ignores_extra_arguments:
        call = drop_extra_arguments(call)
    problem = _check_arguments(call)
    if problem:
        return problem
    return _HANDLERS[call.name](memory, call)


@dataclass
class TurnOutcome:
    """One response's parse and the result of each of its calls, in order."""

    parsed: ParseResult
    results: list[ToolResult] = field(default_factory=list)

    @property
    def successes(self) -> int:
        """Calls with status ``ok`` or ``skipped``."""
        return sum(1 for result in self.results if result.success)

    @property
    def attempts(self) -> int:
        """Parsed calls plus parse errors (each a failed call)."""
        return len(self.results) + len(self.parsed.errors)

    @property
    def errors(self) -> list[ParseError]:
        """The parse errors of the response."""
        return self.parsed.errors


def execute_response(memory: Memory, response: str, call_format: CallFormat,
                     repair: CallRepair = STRICT) -> TurnOutcome:
    """Parse ``response`` and execute its calls on ``memory`` in order, under the call-repair policy."""
    parsed = call_format.parse(response, repair)
    return TurnOutcome(parsed=parsed, results=[execute_call(memory, call, repair) for call in parsed.calls])
