"""The memorising and judge prompts, rendered from the prompt templates (:mod:`memalpha.templates`:
the texts live in ``memalpha/templates/memalpha.yaml`` or the file ``rollout.prompt_templates`` names).

Memorising (docs/method.md: memorising): every chunk gets a fresh ``[system, user]`` prompt, templated
into the token ids the policy generates from by its chat template (:func:`chat_prompt_ids`: rollouts,
the single-turn trainer and supervised fine-tuning alike, so a demonstration's prompt is token for
token the prompt a rollout builds). The
rendered memory is the only part of the system prompt that differs between rollouts, so memalpha's
texts put it last: everything before it is a prefix every turn of a batch shares, which
:mod:`memalpha.lm.core.prompt_sharing` computes once instead of once per row.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, get_args

from memalpha.memory.store import Memory
from memalpha.templates.loader import PromptTemplates, default_templates

if TYPE_CHECKING:
    from memalpha.tools.formats import CallFormat

PromptDetail = Literal["full", "compact"]
PROMPT_DETAILS: tuple[str, ...] = get_args(PromptDetail)


def stated_response_limit(max_new_tokens: int, share: float = 1.0) -> int:
    """The reply budget the memorising user message states: ``share`` of the real cap
    ``max_new_tokens`` (``rollout.stated_limit_share``), truncated as the official code does
    (``int(max_new_tokens * 0.8)``: 1,638 for 2,048), and at least 1.

    ``share`` 1.0 states the cap itself. The product is taken in floating point first, as the
    official code does, so e.g. ``100 × 0.29`` (28.999…) states 28.
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if not 0.0 < share <= 1.0:
        raise ValueError(f"the stated share of the reply budget must be in (0, 1], got {share}")
    return max(1, int(max_new_tokens * share))


def render_memorise(memory: Memory, k: int = 5, templates: PromptTemplates | None = None) -> str:
    """The memory as a memorising turn shows it: the core, then the ``k`` most recent entries of
    each list as ``[id] content``, with totals::

        <core_memory>
        ...core paragraph...
        </core_memory>

        <semantic_memory> (showing the most recent 2 of 7 entries)
        [3fa1] content
        [09cd] content
        </semantic_memory>

        <episodic_memory> (showing the most recent 0 of 0 entries)
        (empty)
        </episodic_memory>

    ``templates`` gives the header and the notes for an empty core, an empty list and a hidden
    list (``view_*``; ``None``: memalpha's, shown above)."""
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    t = templates or default_templates()
    blocks = [t.block("core_memory", memory.core or t.render("view_empty_core"))]
    for tag, entries in (("semantic_memory", memory.semantic), ("episodic_memory", memory.episodic)):
        shown = entries[-k:] if k > 0 else []
        if shown:
            body = "\n".join(f"[{entry.id}] {entry.content}" for entry in shown)
        else:
            body = t.render("view_empty_list" if not entries else "view_hidden_list")
        header = t.render("view_recent_header", shown=len(shown), total=len(entries))
        blocks.append(t.block(tag, body, header))
    return "\n\n".join(blocks)


def memorise_messages(
    memory_view: str,
    chunk: str,
    call_format: CallFormat,
    response_token_limit: int | None = None,
    detail: str = "full",
    templates: PromptTemplates | None = None,
) -> list[dict[str, str]]:
    """The ``[system, user]`` chat messages of one memorising turn (docs/method.md: memorising).

    Args:
        memory_view: the memory rendered for memorising (:func:`render_memorise`).
        chunk: the new input chunk, verbatim.
        call_format: decides the tool block in the system prompt.
        response_token_limit: if given, the user message states the reply budget.
        detail: ``full`` (the default: each memory part explained, the tools' JSON schemas) or
            ``compact`` (a few sentences and one signature line per tool: about 450 tokens less,
            for small models on small budgets).
        templates: the prompt texts (``None``: memalpha's own).
    """
    if detail not in PROMPT_DETAILS:
        raise ValueError(f"prompt detail must be one of {list(PROMPT_DETAILS)}, got {detail!r}")
    t = templates or default_templates()
    compact = detail == "compact"
    tool_block = call_format.instructions(compact=compact, templates=t)
    system = t.render(
        "compact_system" if compact else "memorise_system", memory_view=memory_view, tool_block=tool_block
    )
    limit_note = t.render("response_limit_note", limit=response_token_limit) if response_token_limit else ""
    user = t.render("compact_user" if compact else "memorise_user", chunk=chunk, limit_note=limit_note)
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def chat_prompt_ids(
    tokenizer, messages: list[dict[str, str]], chat_template_kwargs: dict[str, Any] | None = None
) -> list[int]:
    """``messages`` through ``tokenizer``'s chat template with the generation prompt, as token ids."""
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, **(chat_template_kwargs or {})
    )
    if hasattr(ids, "keys"):  # some tokenizers return a BatchEncoding
        ids = ids["input_ids"]
    return list(ids)


def answer_judge_prompt(
    question: str, rubric: str, response: str, templates: PromptTemplates | None = None
) -> str:
    """The yes/no prompt of the ``llm_judge`` metric (LongMemEval-style rubric grading)."""
    return (templates or default_templates()).render(
        "answer_judge", question=question, rubric=rubric, response=response
    )


# ---------------------------------------------------------------------------------------
# Content validity of a memory write (reward r4, the LLM judge): one prompt per memory kind.
# ---------------------------------------------------------------------------------------


def content_judge_messages(
    kind: str, content: str, templates: PromptTemplates | None = None
) -> list[dict[str, str]]:
    """The r4 LLM judge's chat for one write; ``kind`` is ``core``, ``semantic`` or ``episodic``.

    One user message (``content_judge``: the rules and the entry), or, when the templates define
    ``content_judge_system`` (as the official judge sends it), a system message holding the
    kind's rules and a user message holding the entry.
    """
    t = templates or default_templates()
    rules = t.render(f"content_judge_{kind}")
    user = {"role": "user", "content": t.render("content_judge", kind=kind, rules=rules, content=content)}
    if t.content_judge_system is None:
        return [user]
    return [{"role": "system", "content": t.render("content_judge_system", rules=rules)}, user]
