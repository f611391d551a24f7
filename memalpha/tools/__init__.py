"""Memory tools (SPEC §2): schemas, the ``qwen`` and ``hermes`` call formats, the executor.

A rollout turn counts successful calls as results with status ``ok`` or ``skipped``;
each :class:`ParseError` counts as one failed call (see :mod:`memalpha.tools.executor`).
"""

from memalpha.tools.executor import (
    SUCCESS_STATUSES,
    ToolResult,
    TurnOutcome,
    execute_call,
    execute_response,
    turn_call_counts,
)
from memalpha.tools.formats import (
    CALL_FORMATS,
    CallFormat,
    HermesFormat,
    ParseError,
    ParseResult,
    QwenFormat,
    ToolCall,
    get_call_format,
    strip_thinking,
)
from memalpha.tools.schemas import DELETE, INSERT, TOOL_NAMES, TOOL_SCHEMAS, UPDATE, tool_functions

__all__ = [
    "CALL_FORMATS",
    "DELETE",
    "INSERT",
    "SUCCESS_STATUSES",
    "TOOL_NAMES",
    "TOOL_SCHEMAS",
    "UPDATE",
    "CallFormat",
    "HermesFormat",
    "ParseError",
    "ParseResult",
    "QwenFormat",
    "ToolCall",
    "ToolResult",
    "TurnOutcome",
    "execute_call",
    "execute_response",
    "get_call_format",
    "strip_thinking",
    "tool_functions",
    "turn_call_counts",
]
