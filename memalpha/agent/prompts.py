"""Prompt templates: the one place where memalpha's prompt texts live.

Memorising (docs/method.md: memorising): every chunk gets a fresh two-message prompt –

* system: the agent's role, what each memory part is for, the call format's tool block,
  and last the rendered memory (:func:`memalpha.memory.render.render_memorise`);
* user: the task steps and the chunk inside ``<new_chunk>`` tags.

No earlier chunk or response is kept in context. The memory is the only part of the system
prompt that differs between rollouts, so it comes last: everything before it (about 800
tokens with a tool block) is a prefix every turn of a batch shares, which
:mod:`memalpha.lm.prefix_cache` computes once instead of once per row.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from memalpha.tools.formats import CallFormat

MEMORISE_SYSTEM_TEMPLATE = """\
You are an assistant with a long-term memory. Text arrives one chunk at a time and you never see \
an earlier chunk again: what you do not store now is lost. Later, questions about the text will be \
answered from your memory alone.

Your memory has three parts:
- core_memory: one short paragraph that is always shown in full, e.g. who the user is, a summary of \
what is being read, or the rules behind a set of labelled examples.
- semantic_memory: items of general knowledge – facts, definitions, rules, labelled examples.
- episodic_memory: items about events, each with its time ("At <time>, the user did X").

Call the tools below to store what the new chunk adds. Make all your calls in this one reply; \
when nothing is left to store, answer "Done".

{tool_block}

Your memory now:
{memory_view}"""

MEMORISE_USER_TEMPLATE = """\
Store the chunk below in your memory:

1. Core memory: keep it a brief, up-to-date paragraph (a few sentences) – an understanding of the \
user, a summary of what is being read, or the classification rules seen so far (label 1 means …, \
label 2 means …).
2. Episodic memory: record what the user, the people they mention and the assistant did, with the \
time ("At <time>, user did X").
3. Semantic memory: record key facts ("Anna is the user's sister", "Author of Dune: Frank Herbert", \
"Sample: …; Label: …").

<new_chunk>
{chunk}
</new_chunk>{limit_note}"""

RESPONSE_LIMIT_NOTE = "\n\nYour reply may be at most {limit} tokens: keep every call short."


COMPACT_SYSTEM_TEMPLATE = """\
You keep a memory of a long text that arrives one chunk at a time; earlier chunks are never \
shown again. Questions are later answered from your memory alone. Memory parts: core_memory (one \
short paragraph), semantic_memory (facts), episodic_memory (dated events).

{tool_block}

Your memory now:
{memory_view}"""

COMPACT_USER_TEMPLATE = """\
Store the facts of this chunk: facts in semantic_memory, events with their date in episodic_memory.

<new_chunk>
{chunk}
</new_chunk>{limit_note}"""

PROMPT_PROFILES = ("full", "compact")


def memorise_messages(
    memory_view: str,
    chunk: str,
    call_format: CallFormat,
    response_token_limit: int | None = None,
    profile: str = "full",
) -> list[dict[str, str]]:
    """The ``[system, user]`` chat messages of one memorising turn (docs/method.md: memorising).

    Args:
        memory_view: the memory rendered for memorising (:func:`memalpha.memory.render.render_memorise`).
        chunk: the new input chunk, verbatim.
        call_format: decides the tool block in the system prompt.
        response_token_limit: if given, the user message states the reply budget.
        profile: ``full`` (the default: each memory part explained, the tools' JSON schemas) or
            ``compact`` (a few sentences and one signature line per tool: about 450 tokens less,
            for small models on small budgets).
    """
    if profile not in PROMPT_PROFILES:
        raise ValueError(f"prompt profile must be one of {list(PROMPT_PROFILES)}, got {profile!r}")
    compact = profile == "compact"
    system_template = COMPACT_SYSTEM_TEMPLATE if compact else MEMORISE_SYSTEM_TEMPLATE
    user_template = COMPACT_USER_TEMPLATE if compact else MEMORISE_USER_TEMPLATE
    system = system_template.format(memory_view=memory_view, tool_block=call_format.instructions(compact=compact))
    limit_note = RESPONSE_LIMIT_NOTE.format(limit=response_token_limit) if response_token_limit else ""
    user = user_template.format(chunk=chunk, limit_note=limit_note)
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


ANSWER_JUDGE_TEMPLATE = """\
Decide whether a model's response to a question is correct, judged against a rubric that \
describes the desired answer. The response is correct when it recalls and uses the information \
the rubric asks for; it need not mention every point of the rubric.

Question: {question}
Rubric: {rubric}
Response: {response}

Is the response correct? Reply with one word: yes or no."""


def answer_judge_prompt(question: str, rubric: str, response: str) -> str:
    """The yes/no prompt of the ``llm_judge`` metric (LongMemEval-style rubric grading)."""
    return ANSWER_JUDGE_TEMPLATE.format(question=question, rubric=rubric, response=response)


# ---------------------------------------------------------------------------------------
# Content validity of a memory write (reward r4, the LLM judge): one prompt per memory kind.
# ---------------------------------------------------------------------------------------

_CONTENT_JUDGE_RULES = {
    "core": """\
Core memory is one paragraph that is always shown to the assistant: an understanding of the \
user, a summary of what is being read, or rules learned from examples. It is INVALID when
(1) it talks about itself instead of holding content, e.g. it contains the words "core memory" \
("The core memory was updated ...", "This is the core memory");
(2) it only announces content without giving it, e.g. "Here is the summary" or "Rules are \
listed below" with no summary or rules following.
Otherwise it is valid.""",
    "semantic": """\
Semantic memory holds general knowledge: facts about someone or something, definitions, rules, \
explanations, how-to knowledge, findings, or labelled examples. A valid entry states such a piece \
of knowledge; an empty, meaningless or purely announcing entry is invalid.""",
    "episodic": """\
Episodic memory holds events and experiences. A valid entry says what happened and when it \
happened (a date, a time, or a clear relative time); an entry without any time, or without an \
event, is invalid.""",
}

CONTENT_JUDGE_TEMPLATE = """\
You check the quality of one entry an assistant wrote into its {kind} memory.

{rules}

Entry:
{content}

Reply with a JSON object in a ```json code block, exactly these keys:
```json
{{"VALID": true or false, "ISSUES": ["each problem found"], "EXPLANATION": "one sentence"}}
```"""


def content_judge_prompt(kind: str, content: str) -> str:
    """The r4 LLM-judge prompt for one write; ``kind`` is ``core``, ``semantic`` or ``episodic``."""
    if kind not in _CONTENT_JUDGE_RULES:
        raise ValueError(f"content judge: memory kind must be one of {sorted(_CONTENT_JUDGE_RULES)}, got {kind!r}")
    return CONTENT_JUDGE_TEMPLATE.format(kind=kind, rules=_CONTENT_JUDGE_RULES[kind], content=content)
