"""Chunks against the prompt budget, checked when the data loads instead of mid-run.

A memorising turn's prompt holds the system prompt, the rendered memory and one chunk; when it
is over ``rollout.max_prompt_tokens`` the rollout shows fewer memory entries, down to none, and
then stops with a :class:`~memalpha.agent.rollout.RolloutError`. Whether a chunk fits with an
empty memory depends only on the data, the tokenizer and the rollout settings, so
:func:`check_prompt_budget` finds such a chunk before any model loads. It builds the prompts with
the rollout's own :func:`~memalpha.agent.rollout.turn_prompt`, so the verdict is the rollout's.

A turn's prompt grows with the memory only up to a point: the list entries shown shrink to none,
but the core is always shown, up to ``rollout.core_token_limit`` tokens. A chunk that fits with
the core at its cap therefore fits whatever the memory holds: ``check_prompt_budget(...,
full_core=True)`` checks that (``memalpha predict``, which must not stop half-way through an
input), and :func:`chunk_room` gives the largest such chunk (the Python API cuts a text by it).
"""

from __future__ import annotations

from collections.abc import Sequence

from memalpha.agent.rollout import RolloutError, make_token_counter, turn_prompt
from memalpha.agent.rollout_settings import RolloutSettings
from memalpha.data.schema import Instance
from memalpha.memory.store import Memory
from memalpha.tools.formats import get_call_format

MARGIN = 16
"""Tokens a chunk's count may differ from its count inside the prompt (merges at its edges):
chunks this close to the budget get their whole prompt built."""


def core_cap(settings: RolloutSettings) -> str:
    """The core's cap as messages name it."""
    return f"rollout.core_token_limit={settings.core_token_limit}"


def budget_memory(tokenizer, settings: RolloutSettings, full_core: bool) -> Memory:
    """A memory whose turn prompt is as long as the budget check assumes: empty, or (``full_core``)
    with its core cut at ``settings.core_token_limit`` and no entries."""
    memory = Memory(token_counter=make_token_counter(tokenizer), core_token_limit=settings.core_token_limit)
    if full_core:
        memory.core = "memory " * (2 * settings.core_token_limit)
    return memory


def check_prompt_budget(
    instances: Sequence[Instance],
    tokenizer,
    settings: RolloutSettings,
    source: str,
    *,
    full_core: bool = False,
) -> None:
    """Raise a :class:`RolloutError` naming ``source``, the instance and the chunk when a chunk's
    prompt is over ``settings.max_prompt_tokens`` with an empty memory (``full_core``: with the
    core at its cap, so that no memory the agent writes can push a turn over the budget).

    The prompt's own tokens are counted once (with an empty chunk); a chunk counted on its own
    plus those tokens within :data:`MARGIN` of the budget gets its real prompt built, so the
    check costs one tokenizer pass over the chunks and agrees exactly with the rollout.
    """
    if not instances:
        return
    call_format = get_call_format(settings.call_format)
    memory = budget_memory(tokenizer, settings, full_core)
    core = f", with the core memory at {core_cap(settings)}" if full_core else ""

    def prompt_tokens(chunk: str, where: str) -> int:
        return len(turn_prompt(tokenizer, memory, chunk, call_format, settings, where)[1])

    overhead = prompt_tokens("", f"{source}: the prompt without a chunk{core}")
    chunks = [
        (instance, index, chunk) for instance in instances for index, chunk in enumerate(instance.chunks)
    ]
    if not chunks:  # memories to answer from (the memories layout): nothing to read
        return
    counts = tokenizer([chunk for _, _, chunk in chunks], add_special_tokens=False)["input_ids"]
    for (instance, index, chunk), ids in zip(chunks, counts):
        if overhead + len(ids) <= settings.max_prompt_tokens - MARGIN:
            continue
        where = f"{source}: instance {instance.instance_id!r}, chunk {index} ({len(ids)} tokens)"
        if "chunk_tokens" in instance.metadata:
            where += f", cut at data.load.chunk_tokens={instance.metadata['chunk_tokens']}"
        prompt_tokens(chunk, where + core)


def chunk_room(tokenizer, settings: RolloutSettings) -> int:
    """The most tokens a chunk may hold so that its turn fits ``settings.max_prompt_tokens``
    whatever the memory holds (the core at its cap, :data:`MARGIN` tokens to spare for merges at
    the chunk's edges); a :class:`RolloutError` when the prompt leaves no room for a chunk."""
    memory = budget_memory(tokenizer, settings, full_core=True)
    call_format = get_call_format(settings.call_format)
    where = f"the prompt without a chunk, with the core memory at {core_cap(settings)}"
    prompt = turn_prompt(tokenizer, memory, "", call_format, settings, where)[1]
    room = settings.max_prompt_tokens - MARGIN - len(prompt)
    if room < 1:
        raise RolloutError(
            f"rollout.max_prompt_tokens={settings.max_prompt_tokens} leaves no room for a chunk once the core"
            f" memory is at {core_cap(settings)}; raise the one or lower the other"
        )
    return room
