"""The three memory tools (docs/method.md: memorising) as JSON schemas: the single definition everything
reads.

The schemas use the OpenAI/Qwen function format
``{"type": "function", "function": {"name", "description", "parameters"}}``;
the call formats render them into the system prompt and the executor checks
arguments against them (required keys, no extra keys, string types, enums).
"""

from __future__ import annotations

from typing import Any

from memalpha.memory.store import CORE, EPISODIC, SEMANTIC

INSERT = "new_memory_insert"
UPDATE = "memory_update"
DELETE = "memory_delete"

TOOL_SCHEMAS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": INSERT,
            "description": (
                "Add one new item to the semantic or episodic memory; it gets a new id. "
                "The core memory cannot be inserted into: rewrite it with memory_update."
            ),
            "parameters": {
                "type": "object",
                "properties": {
                    "memory_type": {
                        "type": "string",
                        "enum": [SEMANTIC, EPISODIC],
                        "description": "semantic_memory for facts and knowledge, "
                        "episodic_memory for events with a time.",
                    },
                    "content": {"type": "string", "description": "Text of the new memory item."},
                },
                "required": ["memory_type", "content"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": UPDATE,
            "description": (
                "Rewrite memory. For core_memory the new text replaces the whole paragraph; "
                "for semantic_memory or episodic_memory it replaces the item with memory_id."
            ),
            "parameters": {
                "type": "object",
                "properties": {
                    "memory_type": {
                        "type": "string",
                        "enum": [CORE, SEMANTIC, EPISODIC],
                        "description": "Which memory to rewrite.",
                    },
                    "new_content": {"type": "string", "description": "The complete new text."},
                    "memory_id": {
                        "type": "string",
                        "description": "Id of the item to rewrite; needed for semantic/episodic, "
                        "ignored for core_memory.",
                    },
                },
                "required": ["memory_type", "new_content"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": DELETE,
            "description": (
                "Remove memory. For core_memory the paragraph is emptied; for semantic_memory "
                "or episodic_memory the item with memory_id is removed."
            ),
            "parameters": {
                "type": "object",
                "properties": {
                    "memory_type": {
                        "type": "string",
                        "enum": [CORE, SEMANTIC, EPISODIC],
                        "description": "Which memory to delete from.",
                    },
                    "memory_id": {
                        "type": "string",
                        "description": "Id of the item to remove; needed for semantic/episodic, "
                        "ignored for core_memory.",
                    },
                },
                "required": ["memory_type"],
            },
        },
    },
]

TOOL_NAMES: tuple[str, ...] = tuple(schema["function"]["name"] for schema in TOOL_SCHEMAS)


def tool_parameters(name: str) -> dict[str, Any] | None:
    """The ``parameters`` schema of tool ``name``, or ``None`` for an unknown tool."""
    for schema in TOOL_SCHEMAS:
        if schema["function"]["name"] == name:
            return schema["function"]["parameters"]
    return None


def compact_signatures() -> str:
    """One line per tool, ``name(param: a|b, optional?: string): first sentence of its description``.

    The compact prompt detail's tool block: the same tools, arguments and choices as
    :data:`TOOL_SCHEMAS`, in a fraction of the tokens of the JSON schemas.
    """
    lines = []
    for schema in TOOL_SCHEMAS:
        function = schema["function"]
        parameters = function["parameters"]
        required = set(parameters.get("required", ()))
        arguments = []
        for name, spec in parameters["properties"].items():
            kind = "|".join(spec["enum"]) if "enum" in spec else spec.get("type", "string")
            arguments.append(f"{name}{'' if name in required else '?'}: {kind}")
        summary = function["description"].split(". ")[0].rstrip(".")
        lines.append(f"{function['name']}({', '.join(arguments)}): {summary}.")
    return "\n".join(lines)
