"""Memory store: ids, token cache, core cap, rendering, JSON round trip."""

from __future__ import annotations

import json
import random

import pytest

from memalpha.agent.memorise_prompts import render_memorise
from memalpha.memory.store import (
    CORE_TRUNCATION_MARKER,
    Memory,
    MemoryEntry,
    id_for_counter,
    whitespace_token_count,
)
from memalpha.reader.answer_prompts import render_answer


class CountingCounter:
    """Whitespace counter that records how often it is called."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, text: str) -> int:
        self.calls += 1
        return len(text.split())


# ---------------------------------------------------------------------------- ids
def test_ids_are_short_hex_and_deterministic_per_seed():
    first = [id_for_counter(7, i) for i in range(50)]
    assert first == [id_for_counter(7, i) for i in range(50)]
    assert all(len(x) == 4 and int(x, 16) >= 0 for x in first)
    assert first != [id_for_counter(8, i) for i in range(50)]


def test_ids_never_collide_across_the_whole_4_digit_block_and_into_5_digits():
    ids = [id_for_counter(3, i) for i in range(16**4 + 100)]
    assert len(set(ids)) == len(ids)
    assert {len(x) for x in ids[: 16**4]} == {4} and {len(x) for x in ids[16**4 :]} == {5}


def test_memory_ids_unique_across_lists_and_not_reused_after_delete():
    memory = Memory(seed=5)
    a = memory.insert("semantic_memory", "a")
    b = memory.insert("episodic_memory", "b")
    memory.delete("semantic_memory", a.id)
    c = memory.insert("semantic_memory", "a")
    assert len({a.id, b.id, c.id}) == 3


# -------------------------------------------------------------------- operations
def test_insert_update_delete_and_duplicate_skip():
    memory = Memory()
    entry = memory.insert("semantic", "Paris is in France")
    assert isinstance(entry, MemoryEntry) and memory.semantic == [entry]
    assert memory.insert("semantic_memory", "Paris is in France") is None
    assert memory.insert("episodic_memory", "Paris is in France") is not None  # lists are separate
    memory.update("semantic_memory", entry.id, "Paris is the capital of France")
    assert memory.find("semantic_memory", entry.id).content == "Paris is the capital of France"
    assert memory.delete("semantic_memory", entry.id).id == entry.id
    assert memory.semantic == []
    with pytest.raises(KeyError):
        memory.delete("semantic_memory", entry.id)
    with pytest.raises(KeyError):
        memory.update("episodic_memory", "zzzz", "x")
    with pytest.raises(ValueError, match="memory_type"):
        memory.entries("core_memory")


def test_token_counts_are_cached_per_content():
    counter = CountingCounter()
    memory = Memory(token_counter=counter)
    base = counter.calls
    for i in range(300):
        memory.insert("semantic_memory", f"fact number {i}")
    memory.set_core("one two three")
    assert memory.total_tokens() == 3 + 300 * 3
    after_first = counter.calls
    assert after_first - base == 301  # 300 entries + the core once (set_core counted it; total reuses it)
    assert memory.total_tokens() == 903
    assert counter.calls == after_first
    memory.update("semantic_memory", memory.semantic[0].id, "changed")
    assert memory.total_tokens() == 903 - 3 + 1


# ---------------------------------------------------------------------- core cap
def test_core_under_limit_is_kept_verbatim():
    memory = Memory(core_token_limit=50)
    assert memory.set_core("short core text") is False
    assert memory.core == "short core text"


def test_core_over_limit_is_cut_at_a_word_with_visible_marker():
    memory = Memory(core_token_limit=40)
    text = " ".join(f"word{i}" for i in range(100))
    memory.core = text
    marker = CORE_TRUNCATION_MARKER.format(limit=40)
    assert memory.core.endswith(marker)
    kept = memory.core[: -len(marker)]
    assert text.startswith(kept) and text[len(kept)] == " "  # ends on a word boundary
    assert whitespace_token_count(memory.core) <= 40
    assert whitespace_token_count(memory.core) == 40  # longest prefix that fits


def test_core_limit_smaller_than_marker_is_refused():
    with pytest.raises(ValueError, match="too small"):
        Memory(core_token_limit=3)


@pytest.mark.embedded
def test_core_cap_with_real_tokenizer(tokenizer):
    def count(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    memory = Memory(token_counter=count, core_token_limit=64)
    text = "The patient cohort (n=173) received 4 mg/day of dorzolamide-timolol. " * 20
    assert memory.set_core(text) is True
    assert count(memory.core) <= 64
    assert count(memory.core) > 50  # not cut far more than needed
    assert text.startswith(memory.core[: -len(memory.core_marker)])


# --------------------------------------------------------------------- rendering
def _small_memory() -> Memory:
    memory = Memory(seed=0)
    memory.core = "User studies medicine."
    for i in range(3):
        memory.insert("semantic_memory", f"fact {i}")
    return memory


def test_render_memorise_exact_layout():
    memory = _small_memory()
    ids = [e.id for e in memory.semantic]
    assert render_memorise(memory, k=2) == (
        "<core_memory>\nUser studies medicine.\n</core_memory>\n\n"
        "<semantic_memory> (showing the most recent 2 of 3 entries)\n"
        f"[{ids[1]}] fact 1\n[{ids[2]}] fact 2\n</semantic_memory>\n\n"
        "<episodic_memory> (showing the most recent 0 of 0 entries)\n(empty)\n</episodic_memory>"
    )


def test_render_memorise_empty_memory_and_k_zero():
    assert render_memorise(Memory()).startswith("<core_memory>\n(empty)\n</core_memory>")
    view = render_memorise(_small_memory(), k=0)
    assert "(showing the most recent 0 of 3 entries)" in view and "fact" not in view


def test_render_answer_numbers_entries_without_ids():
    memory = _small_memory()
    event = memory.insert("episodic_memory", "At 2024-01-01, user read a paper.")
    text = render_answer(memory, memory.semantic[1:], [event])
    assert text == (
        "<core_memory>\nUser studies medicine.\n</core_memory>\n\n"
        "<semantic_memory>\n1. fact 1\n2. fact 2\n</semantic_memory>\n\n"
        "<episodic_memory>\n1. At 2024-01-01, user read a paper.\n</episodic_memory>"
    )
    assert event.id not in text
    memory.clear_core()
    assert render_answer(memory, [], []).startswith("<semantic_memory>\n(no entries)")


# ----------------------------------------------------------------- serialisation
def _random_operations(memory: Memory, rng: random.Random, steps: int) -> None:
    for _ in range(steps):
        kind = rng.choice(["semantic_memory", "episodic_memory"])
        entries = memory.entries(kind)
        op = rng.random()
        if op < 0.5 or not entries:
            memory.insert(kind, f"text {rng.randrange(40)} ünïcødé ✿ \"quoted\"\n")
        elif op < 0.7:
            memory.update(kind, rng.choice(entries).id, f"updated {rng.randrange(1000)}")
        elif op < 0.9:
            memory.delete(kind, rng.choice(entries).id)
        else:
            memory.core = " ".join(str(rng.random()) for _ in range(rng.randrange(1, 20)))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_same_operations_on_the_same_seed_give_the_same_memory(seed):
    first, second = Memory(core_token_limit=16, seed=seed), Memory(core_token_limit=16, seed=seed)
    _random_operations(first, random.Random(seed), 200)
    _random_operations(second, random.Random(seed), 200)
    assert json.loads(json.dumps(first.to_dict())) == second.to_dict()


def test_ten_thousand_entries_total_tokens_counts_each_content_once():
    counter = CountingCounter()
    memory = Memory(token_counter=counter)
    for i in range(10_000):
        memory.insert("semantic_memory" if i % 2 else "episodic_memory", f"entry {i} about something")
    calls = counter.calls
    assert memory.total_tokens() == 40_000
    assert counter.calls - calls == 10_000
    assert memory.total_tokens() == 40_000
    assert counter.calls - calls == 10_000  # second size computation: cache only
    view = render_memorise(memory, 5)
    assert "(showing the most recent 5 of 5000 entries)" in view
    assert render_answer(memory, memory.semantic, memory.episodic).count("\n") > 10_000
