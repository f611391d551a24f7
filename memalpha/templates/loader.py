"""The prompt-template file: its fields (:class:`PromptTemplates`), its checks and its loader.

The file maps each field of :class:`PromptTemplates` to a :meth:`str.format` template (literal
braces doubled: ``{{`` and ``}}``). memalpha's own texts are ``memalpha.yaml`` next to this
module, the default; a config replaces them all at once with ``rollout.prompt_templates: PATH``
(``memalpha prompts import`` writes such a file from a local clone of the official Mem-α code,
:mod:`memalpha.templates.official`). :func:`load_templates` checks the file: every field present
(but the optional ``content_judge_system`` and ``content_judge_retry``), no other key, and each template
holding exactly the placeholders its caller fills (:data:`PLACEHOLDERS`; ``tool_block_qwen`` may instead be a
fixed text without any), so a wrong file fails when the config is read, not mid-run.

This package is a leaf: it imports nothing from memalpha, so every layer (memory, tools,
reader, agent, train) can take a :class:`PromptTemplates`.
"""

from __future__ import annotations

import string
from dataclasses import dataclass, fields
from functools import lru_cache
from importlib import resources
from pathlib import Path

import yaml

DEFAULT_FILE = "memalpha.yaml"
"""memalpha's own texts, shipped inside this package."""

PLACEHOLDERS: dict[str, frozenset[str]] = {
    name: frozenset(names)
    for name, names in {
        # memorising (memalpha.agent.memorise_prompts)
        "memorise_system": ("tool_block", "memory_view"),
        "memorise_user": ("chunk", "limit_note"),
        "compact_system": ("tool_block", "memory_view"),
        "compact_user": ("chunk", "limit_note"),
        "response_limit_note": ("limit",),
        # the tool block (memalpha.tools.formats)
        "tool_block_qwen": ("tools", "tool_names"),
        "tool_block_hermes": ("tools",),
        "tool_block_hermes_compact": ("tools",),
        # memory views (render_memorise in memalpha.agent.memorise_prompts, render_answer in
        # memalpha.reader.answer_prompts)
        "view_recent_header": ("shown", "total"),
        "view_empty_core": (),
        "view_empty_list": (),
        "view_hidden_list": (),
        "answer_view_empty_list": (),
        # the reader (memalpha.reader.answer_prompts)
        "answer_system": ("memory",),
        "answer_system_no_core": ("memory",),
        "answer_user": ("instruction", "question"),
        # judges (memalpha.agent.memorise_prompts)
        "answer_judge": ("question", "rubric", "response"),
        "content_judge": ("kind", "rules", "content"),
        "content_judge_core": (),
        "content_judge_semantic": (),
        "content_judge_episodic": (),
        "content_judge_system": ("rules",),
        "content_judge_retry": (),
    }.items()
}
"""Each template's placeholders: exactly these, each filled by the code that renders it.

When a file defines ``content_judge_system`` (the judge's rules as a system message),
``content_judge`` is the user message alone and holds ``{kind}`` and ``{content}`` only
(:func:`wanted_placeholders`)."""

OPTIONAL_TEMPLATES: frozenset[str] = frozenset({"content_judge_system", "content_judge_retry"})
"""Templates a file may leave out (:class:`PromptTemplates` holds ``None`` for them)."""

FIXED_TEMPLATES: frozenset[str] = frozenset({"tool_block_qwen"})
"""Templates that may instead hold no placeholder at all: a fixed text, such as the official tool
block ``memalpha prompts import --qwen-agent`` writes (the official tools' own descriptions)."""


@dataclass(frozen=True)
class PromptTemplates:
    """One full set of prompt texts (see ``memalpha.yaml`` for what each is).

    Args:
        memorise_system: System message of a memorising turn (``full`` prompt detail).
        memorise_user: User message of a memorising turn (``full``).
        compact_system: System message of a memorising turn (``compact`` prompt detail).
        compact_user: User message of a memorising turn (``compact``).
        response_limit_note: Appended to the user message when the reply has a token budget.
        tool_block_qwen: The tool block of the ``qwen`` call format (or a fixed text without
            placeholders, which then lists the tools itself).
        tool_block_hermes: The tool block of the ``hermes`` call format (JSON schemas).
        tool_block_hermes_compact: The tool block of ``hermes`` under the ``compact`` prompt detail.
        view_recent_header: Memorising view: the header after a list's tag.
        view_empty_core: Memorising view: the body of an empty core.
        view_empty_list: Memorising view: the body of an empty list.
        view_hidden_list: Memorising view: the body of a list none of whose entries is shown (k = 0).
        answer_view_empty_list: Reader's view: the body of a list with no retrieved entry.
        answer_system: Reader's system message when the core memory is not empty.
        answer_system_no_core: Reader's system message when the core memory is empty.
        answer_user: Reader's user message when the source has a question instruction.
        answer_judge: The yes/no prompt of the ``llm_judge`` metric.
        content_judge: The r4 content-judge prompt of one memory write (its user message when
            ``content_judge_system`` is set: then without ``{rules}``).
        content_judge_core: The rules the content judge gets for a core-memory write.
        content_judge_semantic: The rules for a semantic-memory write.
        content_judge_episodic: The rules for an episodic-memory write.
        content_judge_system: Optional (``None``: absent). When set, the content judge gets two
            messages, this text (with ``{rules}``) as the system message and ``content_judge``
            as the user message, as the official judge does; absent, it gets ``content_judge``
            as one user message.
        content_judge_retry: Optional (``None``: absent). Appended to the content judge's user
            message each time its judgement of a write is malformed and the write is asked again
            (``reward.content_judge_attempts`` > 1), so the n-th ask carries it n - 1 times, as
            the official per-call judge appends its sentence; absent, the write is asked again
            with the same messages.
    """

    memorise_system: str
    memorise_user: str
    compact_system: str
    compact_user: str
    response_limit_note: str
    tool_block_qwen: str
    tool_block_hermes: str
    tool_block_hermes_compact: str
    view_recent_header: str
    view_empty_core: str
    view_empty_list: str
    view_hidden_list: str
    answer_view_empty_list: str
    answer_system: str
    answer_system_no_core: str
    answer_user: str
    answer_judge: str
    content_judge: str
    content_judge_core: str
    content_judge_semantic: str
    content_judge_episodic: str
    content_judge_system: str | None = None
    content_judge_retry: str | None = None
    source: str = DEFAULT_FILE

    def render(self, name: str, **values: object) -> str:
        """Template ``name`` filled with ``values`` (exactly its placeholders); an optional template is
        rendered only where its caller has found it set."""
        return getattr(self, name).format(**values)

    @staticmethod
    def block(tag: str, body: str, header: str = "") -> str:
        """One part of a memory view: ``body`` between a ``<tag>`` line (followed by ``header``,
        when given) and a ``</tag>`` line, the same in every template file."""
        head = f"<{tag}> {header}" if header else f"<{tag}>"
        return f"{head}\n{body}\n</{tag}>"


TEMPLATE_NAMES: tuple[str, ...] = tuple(f.name for f in fields(PromptTemplates) if f.name != "source")
assert set(TEMPLATE_NAMES) == set(PLACEHOLDERS), "PLACEHOLDERS must name every template field"


def placeholders(template: str) -> set[str]:
    """The ``{names}`` of a :meth:`str.format` template; raises ``ValueError`` on a malformed one
    or on a positional ``{}``/``{0}`` field."""
    found = set()
    for _, name, _, _ in string.Formatter().parse(template):
        if name is None:
            continue
        if name == "" or name.isdigit():
            raise ValueError("has a positional {} field; name every placeholder")
        found.add(name)
    return found


def wanted_placeholders(name: str, texts: dict) -> frozenset[str]:
    """The placeholders template ``name`` must hold in the file ``texts`` (:data:`PLACEHOLDERS`,
    but ``content_judge`` without ``{rules}`` when ``content_judge_system`` holds them)."""
    if name == "content_judge" and isinstance(texts.get("content_judge_system"), str):
        return PLACEHOLDERS[name] - {"rules"}
    return PLACEHOLDERS[name]


def check_templates(texts: object, where: str) -> dict[str, str]:
    """``texts`` checked as a template file's content; every error is one line naming ``where`` and the key.

    The result holds every template the file defines (an optional one left out, or null, is absent)."""
    if not isinstance(texts, dict):
        raise ValueError(f"{where}: a prompt-template file must be a mapping of template names to texts")  # noqa: TRY004
    unknown = sorted(str(key) for key in texts if key not in PLACEHOLDERS)
    if unknown:
        raise ValueError(f"{where}: unknown template key(s) {unknown}; known: {sorted(PLACEHOLDERS)}")
    missing = [name for name in TEMPLATE_NAMES if name not in texts and name not in OPTIONAL_TEMPLATES]
    if missing:
        raise ValueError(f"{where}: missing template key(s) {missing}")
    present = [
        name for name in TEMPLATE_NAMES if not (name in OPTIONAL_TEMPLATES and texts.get(name) is None)
    ]
    for name in present:
        text = texts[name]
        if not isinstance(text, str):
            raise ValueError(f"{where}: {name} must be a text, got {type(text).__name__}")  # noqa: TRY004
        try:
            found = placeholders(text)
        except ValueError as exc:
            raise ValueError(
                f"{where}: {name} is not a valid template ({exc}; double literal braces)"
            ) from None
        wanted = frozenset() if name in FIXED_TEMPLATES and not found else wanted_placeholders(name, texts)
        if found != wanted:
            raise ValueError(
                f"{where}: {name} must have exactly the placeholders {sorted(wanted)}, got {sorted(found)}"
                " (double literal braces: {{ }})"
            )
    return {name: texts[name] for name in present}


@lru_cache(maxsize=1)
def default_templates() -> PromptTemplates:
    """memalpha's own texts (cached)."""
    text = resources.files(__package__).joinpath(DEFAULT_FILE).read_text(encoding="utf-8")
    return PromptTemplates(**check_templates(yaml.safe_load(text), f"memalpha/templates/{DEFAULT_FILE}"))


def load_templates(path: str | Path | None = None) -> PromptTemplates:
    """The templates of the YAML file ``path``; ``None`` for memalpha's own (``memalpha.yaml``).

    Raises a one-line ``ValueError`` naming the file (and the key) when the file is missing, is
    not YAML, or fails :func:`check_templates`.
    """
    if path is None:
        return default_templates()
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"{file}: prompt-template file not found")
    try:
        content = yaml.safe_load(file.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        reason = " ".join(str(exc).split())
        raise ValueError(f"{file}: not a readable YAML file ({reason})") from None
    return PromptTemplates(**check_templates(content, str(file)), source=str(file))


def dump_templates(texts: dict[str, str], header: str = "") -> str:
    """``texts`` (checked) as the YAML of a template file: block scalars for multi-line texts,
    in :data:`TEMPLATE_NAMES` order, ``header`` as leading comment lines."""
    checked = check_templates(texts, "<dump>")

    class _Dumper(yaml.SafeDumper):
        pass

    def _text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
        block = "\n" in value and not value.startswith(("\n", " ")) and not any(
            line != line.rstrip() for line in value.split("\n")
        )
        style = "|" if block else ('"' if "\n" in value else None)
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    _Dumper.add_representer(str, _text)
    lines = [f"# {line}".rstrip() for line in header.splitlines()]
    body = yaml.dump(checked, Dumper=_Dumper, allow_unicode=True, sort_keys=False, width=100)
    out = ("\n".join(lines) + "\n\n" if lines else "") + body
    if yaml.safe_load(out) != checked:  # the written file must load back to the very same texts
        raise ValueError("prompt templates do not survive a YAML round trip")
    return out
