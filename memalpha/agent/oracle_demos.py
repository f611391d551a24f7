"""Oracle demonstrations: memorising turns that store every fact of a chunk, for a cold start.

A small model never writes a well-formed tool call by itself, so every GRPO group has the
same reward and nothing is learned (``docs/cold_start.md``). Supervised fine-tuning on
demonstrations fixes that first. :func:`oracle_demonstrations` walks a synthetic instance
chunk by chunk exactly as a rollout does (the same prompt from :func:`turn_prompt`, the same
call format, a memory seeded as rollout 0's) and writes, as the reply, the calls that store
each fact the chunk tells in the memory list it belongs in
(``metadata["notes"]`` of :mod:`memalpha.data.synthetic`). The calls are executed, so the next
chunk's prompt shows the memory they built. The wording around and inside the calls varies
with a seeded RNG, so the model learns the task rather than one string.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from memalpha.agent.rollout import make_token_counter, turn_prompt
from memalpha.agent.rollout_settings import RolloutSettings
from memalpha.data.demo_files import Demonstration
from memalpha.data.schema import Instance
from memalpha.memory.store import Memory
from memalpha.seeding import stable_seed
from memalpha.tools.executor import SUCCESS_STATUSES, execute_call
from memalpha.tools.formats import get_call_format
from memalpha.tools.schemas import INSERT

OPENINGS = (
    "",
    "Storing what this chunk adds.",
    "New facts to remember:",
    "I will save the new information.",
    "Saving the key facts from this chunk.",
)
CLOSINGS = ("", "Done.", "All new facts are stored.", "Done: everything new is in memory.")
EVENT_FORMS = ("On {date}, {fact}", "{date}: {fact}", "{bare} (on {date}).")
FACT_FORMS = ("{fact}", "{fact}", "Fact: {fact}")


class OracleError(ValueError):
    """An instance cannot be turned into oracle demonstrations (no notes, or a reply over the budget)."""


def note_contents(notes: Sequence[dict[str, str]], rng: random.Random) -> list[tuple[str, str]]:
    """``(memory_type, content)`` for each note: the fact, dated when it is an event, in a varied form."""
    contents = []
    for note in notes:
        if note.get("date"):
            fact = note["fact"]
            text = rng.choice(EVENT_FORMS).format(date=note["date"], fact=fact, bare=fact.rstrip("."))
        else:
            text = rng.choice(FACT_FORMS).format(fact=note["fact"])
        contents.append((note["memory_type"], text))
    return contents


def _reply(call_format, contents: list[tuple[str, str]], rng: random.Random, framed: bool) -> str:
    calls = [(INSERT, {"memory_type": memory_type, "content": text}) for memory_type, text in contents]
    parts = [rng.choice(OPENINGS), call_format.render_calls(calls), rng.choice(CLOSINGS)] if framed else [
        call_format.render_calls(calls)
    ]
    return "\n".join(part for part in parts if part)


DATE_HEADERS = ("On {date}: ", "{date}: ", "{date} - ")


def packed_contents(notes: Sequence[dict[str, str]], rng: random.Random) -> list[tuple[str, str]]:
    """The compact form: one content per memory list, the facts of one date after it once
    (the date header's wording varies)."""
    merged: dict[str, dict[str | None, list[str]]] = {}
    for note in notes:
        merged.setdefault(note["memory_type"], {}).setdefault(note.get("date"), []).append(note["fact"])
    header = rng.choice(DATE_HEADERS)
    contents = []
    for memory_type, by_date in merged.items():
        parts = [
            " ".join(facts) if date is None else header.format(date=date) + " ".join(facts)
            for date, facts in by_date.items()
        ]
        contents.append((memory_type, " ".join(parts)))
    return contents


DEFAULT_REPLY_SHARE = 0.75

EXAMPLE_FAMILIES = frozenset({"synth_icl"})
"""Families whose notes are interchangeable labelled examples, not facts a question asks for: where
storing every example of a chunk would not fit the reply, a demonstration stores the first ones that
do, in the order the chunk gives them (the agent keeps a sample of the examples, within its reply)."""


def examples_that_fit(notes: Sequence[dict[str, str]], call_format, count_tokens, budget: float) -> int:
    """How many leading example ``notes`` one packed insert stores within ``budget`` tokens (with the
    end-of-turn token); examples carry no date, so the packed form's date header never enters."""

    def length(n: int) -> int:
        packing = packed_contents(notes[:n], random.Random(0))
        return count_tokens(_reply(call_format, packing, None, False)) + 1

    low, high = 0, len(notes)  # notes[:low] fit; notes[:high + 1] do not, or high is all of them
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if length(middle) <= budget else (low, middle - 1)
    return low


def oracle_demonstrations(
    instances: Sequence[Instance],
    tokenizer,
    settings: RolloutSettings,
    seed: int = 0,
    reply_share: float = DEFAULT_REPLY_SHARE,
) -> list[Demonstration]:
    """One demonstration per chunk of every instance; each reply stores all of the chunk's facts.

    A reply holds one insert per fact, with a varied opening and closing line; when that would
    not fit in ``reply_share`` of ``settings.max_new_tokens`` (with the end-of-turn token) the
    lines are dropped, and then the facts of each memory list share one insert
    (:func:`packed_contents`). For the example families (:data:`EXAMPLE_FAMILIES`) the reply then
    stores the leading examples that fit that share (:func:`examples_that_fit`). Only if no form
    fits that share does the first form that fits the whole budget serve. The headroom matters: a
    model imitates the demonstrations' length with some slack, and demonstrations written up to the
    cap teach replies that the cap cuts (a cut call fails; docs/cold_start.md). Raises
    :class:`OracleError` for an instance without ``metadata["notes"]`` or a chunk whose facts cannot
    fit, and ``AssertionError`` if a reply's calls do not all execute (a bug).
    """
    if not 0.0 < reply_share <= 1.0:
        raise ValueError(f"reply_share must be in (0, 1], got {reply_share}")
    call_format = get_call_format(settings.call_format)
    count_tokens = make_token_counter(tokenizer)
    demos: list[Demonstration] = []
    for instance in instances:
        notes = instance.metadata.get("notes")
        if not isinstance(notes, list) or len(notes) != len(instance.chunks):
            raise OracleError(
                f"instance {instance.instance_id!r}: metadata['notes'] must list the facts of each of its "
                f"{len(instance.chunks)} chunks (synthetic instances carry it; other data has no oracle)"
            )
        rng = random.Random(stable_seed(seed, "oracle", instance.instance_id))
        memory = Memory(
            token_counter=count_tokens,
            core_token_limit=settings.core_token_limit,
            seed=stable_seed(seed, instance.instance_id, 0),
        )
        for chunk_index, chunk in enumerate(instance.chunks):
            where = f"instance {instance.instance_id!r}, chunk {chunk_index}"
            messages, _ = turn_prompt(tokenizer, memory, chunk, call_format, settings, where=where)
            separate = note_contents(notes[chunk_index], rng)
            forms = [
                (packing, _reply(call_format, packing, rng, framed))
                for packing, framed in (
                    (separate, True),
                    (separate, False),
                    (packed_contents(notes[chunk_index], rng), False),
                )
            ]
            lengths = [count_tokens(reply) + 1 for _, reply in forms]  # + the end-of-turn token
            share = reply_share * settings.max_new_tokens
            fitting = [i for i, n in enumerate(lengths) if n <= share]
            if not fitting and instance.data_source in EXAMPLE_FAMILIES:  # a sample, within the share
                kept = examples_that_fit(notes[chunk_index], call_format, count_tokens, share)
                packing = packed_contents(notes[chunk_index][:kept], rng)
                forms.append((packing, _reply(call_format, packing, rng, False)))
                fitting = [len(forms) - 1] if kept else []
            fitting = fitting or [i for i, n in enumerate(lengths) if n <= settings.max_new_tokens]
            packing, reply = forms[fitting[0]] if fitting else forms[-1]
            if not fitting:
                raise OracleError(
                    f"{where}: storing its {len(notes[chunk_index])} facts takes {lengths[-1]} tokens, "
                    f"over rollout.max_new_tokens={settings.max_new_tokens}; "
                    "raise it or use fewer facts per chunk"
                )
            parsed = call_format.parse(reply)
            results = [execute_call(memory, call) for call in parsed.calls]
            failed = [r for r in results if r.status not in SUCCESS_STATUSES] + list(parsed.errors)
            assert not failed and len(results) == len(packing), f"{where}: oracle calls failed: {failed}"
            demos.append(
                Demonstration(
                    messages=messages,
                    response=reply,
                    metadata={
                        "source": "oracle",
                        "instance_id": instance.instance_id,
                        "data_source": instance.data_source,
                        "chunk_index": chunk_index,
                        "call_format": call_format.name,
                    },
                )
            )
    return demos
