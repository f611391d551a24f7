"""The official reader's retrieval: BM25Okapi scoring (the ``rank_bm25`` package, pinned at 0.2.2,
as the official server imports it) and the k rule.

The package's scores are checked against numbers worked out by hand below, and its rankings and
scores on the recorded Mem-α-4B memories against those memalpha's own BM25Okapi (before it gave way
to the package) recorded in ``tests/fixtures/memalpha4b_pubmed/okapi_top20.jsonl``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rank_bm25 import BM25Okapi

from memalpha.memory.store import EPISODIC, SEMANTIC, Memory, MemoryEntry
from memalpha.reader.answer_prompts import answer_messages, render_answer
from memalpha.reader.base import Reader, ReaderAnswer
from memalpha.reader.options import RetrievalSettings
from memalpha.reader.question_instructions import QuestionInstructions
from memalpha.reader.retrieval import (
    K_RULES,
    rank_entries,
    shrink_while_over,
    tokenize,
)
from memalpha.reader.settings import ReaderSettings

FIXTURE = Path(__file__).parent / "fixtures" / "memalpha4b_pubmed"

# ---------------------------------------------------------------------------------------
# scores, by hand
# ---------------------------------------------------------------------------------------


def test_three_documents_by_hand():
    corpus = [["the", "cat", "sat"], ["the", "cat", "the", "dog"], ["a", "bird"]]
    # N = 3, avgdl = (3 + 4 + 2) / 3 = 3.
    # Document frequencies: the 2, cat 2, sat 1, dog 1, a 1, bird 1.
    #   n = 2: idf = log(3 - 2 + 0.5) - log(2 + 0.5) = log(0.6) < 0  -> floored
    #   n = 1: idf = log(3 - 1 + 0.5) - log(1 + 0.5) = log(5/3)
    # Mean idf over the six words, before the floor: (2 log 0.6 + 4 log(5/3)) / 6 = log(5/3) / 3
    # (log 0.6 = -log(5/3)); floor = 0.25 * log(5/3) / 3 = log(5/3) / 12 for "the" and "cat".
    floor = math.log(5 / 3) / 12
    index = BM25Okapi(corpus)
    assert index.idf["the"] == pytest.approx(floor, abs=1e-15)
    assert index.idf["cat"] == pytest.approx(floor, abs=1e-15)
    assert index.idf["sat"] == pytest.approx(math.log(5 / 3), abs=1e-15)
    # Length norm k1 * (1 - b + b * dl / avgdl) with k1 = 1.5, b = 0.75:
    #   dl 3: 1.5 * (0.25 + 0.75)  = 1.5;  dl 4: 1.5 * (0.25 + 1.0) = 1.875;  dl 2: 1.5 * (0.25 + 0.5) = 1.125
    length_norm = index.k1 * (1 - index.b + index.b * np.array(index.doc_len) / index.avgdl)
    np.testing.assert_allclose(length_norm, [1.5, 1.875, 1.125], rtol=0, atol=1e-15)
    # Query "cat cat bird fish": "cat" counts twice, "fish" is in no document (idf 0).
    #   tf part tf * 2.5 / (tf + norm): cat in d0 2.5 / 2.5 = 1; cat in d1 2.5 / 2.875 = 20/23;
    #   bird in d2 2.5 / 2.125 = 20/17.
    #   d0 = 2 * floor * 1 = log(5/3) / 6
    #   d1 = 2 * floor * 20/23 = log(5/3) / 6 * 20/23
    #   d2 = log(5/3) * 20/17
    expected = [math.log(5 / 3) / 6, math.log(5 / 3) / 6 * 20 / 23, math.log(5 / 3) * 20 / 17]
    scores = index.get_scores(["cat", "cat", "bird", "fish"])
    assert scores.dtype == np.float64
    np.testing.assert_allclose(scores, expected, rtol=1e-14, atol=0)
    # the repeat counts: one "cat" gives exactly half of d0's and d1's scores
    np.testing.assert_allclose(index.get_scores(["cat"]), [expected[0] / 2, expected[1] / 2, 0.0],
                               rtol=1e-14, atol=0)


def test_the_floor_is_negative_when_the_mean_idf_is_and_a_zero_idf_is_kept():
    corpus = [["x"], ["x", "y"]]
    # N = 2: x in 2 documents: idf = log(0.5) - log(2.5) = log(0.2) < 0;
    #        y in 1 document:  idf = log(1.5) - log(1.5) = 0, not below 0, so not floored.
    # Mean idf = log(0.2) / 2; floor = 0.25 * log(0.2) / 2 = log(0.2) / 8 (negative).
    floor = math.log(0.2) / 8
    index = BM25Okapi(corpus)
    assert index.idf["y"] == 0.0
    assert index.idf["x"] == pytest.approx(floor, abs=1e-15)
    # avgdl = 1.5; norms 1.5 * (0.25 + 0.75 * 1 / 1.5) = 1.125 and 1.5 * (0.25 + 0.75 * 2 / 1.5) = 1.875
    # x: d0 = floor * 2.5 / 2.125 = floor * 20/17; d1 = floor * 2.5 / 2.875 = floor * 20/23
    np.testing.assert_allclose(index.get_scores(["x"]), [floor * 20 / 17, floor * 20 / 23],
                               rtol=1e-14, atol=0)
    np.testing.assert_array_equal(index.get_scores(["y"]), [0.0, 0.0])


def test_degenerate_lists_keep_memory_order():
    """A list without any word (where the package itself divides by zero) scores 0 everywhere, as
    does a query word in no entry: memory order; an empty list or a query without words gives nothing."""
    wordless = [MemoryEntry(str(i), text) for i, text in enumerate(["?!", "", "..."])]
    assert [e.id for e in rank_entries(wordless, ["a"], 3, bm25="okapi")[0]] == ["0", "1", "2"]
    with pytest.raises(ZeroDivisionError):  # the case memalpha guards
        BM25Okapi([tokenize(e.content) for e in wordless])
    words = [MemoryEntry("0", "a"), MemoryEntry("1", "b")]
    assert [e.id for e in rank_entries(words, ["zzz"], 2, bm25="okapi")[0]] == ["0", "1"]
    assert rank_entries([], ["a"], 3, bm25="okapi") == [[]]
    assert rank_entries(words, ["?!"], 3, bm25="okapi") == [[]]


def _recorded_lists():
    """(entries, question) for every question and non-empty list of the recorded Mem-α-4B memories."""
    memories = json.loads((FIXTURE / "final_memory.json").read_text(encoding="utf-8"))
    rows = [
        json.loads(line)
        for line in (FIXTURE / "reader_results.jsonl").read_text(encoding="utf-8").splitlines()
    ]
    for row in rows:
        for kind in ("semantic", "episodic"):
            items = memories[row["instance_id"]][kind]
            if items:
                yield [MemoryEntry(*next(iter(item.items()))) for item in items], row["question"]


def test_rank_bm25_gives_the_recorded_top20_and_scores():
    """The package against memalpha's own BM25Okapi, which it replaced: on all 600 lists of the
    recorded memories (300 questions x semantic, episodic) the same top 20 in the same order, with
    the same scores (recorded by the old code; equal bit for bit when recorded, compared here with a
    float tolerance), and the official server's ranking (a stable sort on the package's scores)."""
    recorded = [
        json.loads(line) for line in (FIXTURE / "okapi_top20.jsonl").read_text(encoding="utf-8").splitlines()
    ]
    lists = list(_recorded_lists())
    assert len(recorded) == len(lists) == 600
    for (entries, question), want in zip(lists, recorded):
        top = rank_entries(entries, [question], 20, bm25="okapi")[0]
        assert [e.id for e in top] == want["ids"], want
        scores = BM25Okapi([tokenize(e.content) for e in entries]).get_scores(tokenize(question))
        by_id = {e.id: float(score) for e, score in zip(entries, scores)}
        np.testing.assert_allclose([by_id[i] for i in want["ids"]], want["scores"], rtol=1e-12, atol=1e-12)
        official = [entries[i] for i, _ in sorted(enumerate(scores), key=lambda t: t[1], reverse=True)][:20]
        assert top == official


def test_lucene_and_okapi_orders_on_the_recorded_memories():
    """The numbers docs/method.md quotes: 300 questions, 600 lists (each list has at most 10 entries,
    so top 20 keeps them all and only the order differs)."""
    lists = differ = first_differs = 0
    for entries, question in _recorded_lists():
        lucene = rank_entries(entries, [question], 20, bm25="lucene")[0]
        okapi = rank_entries(entries, [question], 20, bm25="okapi")[0]
        assert sorted(e.id for e in lucene) == sorted(e.id for e in okapi) == sorted(e.id for e in entries)
        lists += 1
        differ += lucene != okapi
        first_differs += lucene[0] != okapi[0]
    assert (lists, differ, first_differs) == (600, 550, 244)


# ---------------------------------------------------------------------------------------
# ranking
# ---------------------------------------------------------------------------------------

DOG_SUN = ["dog", "sun dog", "sun"]
# N = 3: "dog" and "sun" are each in 2 documents, both idf log(0.6) < 0, so the mean idf is
# log(0.6) and the floor 0.25 * log(0.6) is negative: under Okapi a document holding "dog" scores
# below one that does not; Lucene's idf is never negative.


def test_okapi_and_lucene_rank_differently_and_ties_keep_memory_order():
    entries = [MemoryEntry(str(i), text) for i, text in enumerate(DOG_SUN)]
    assert [e.id for e in rank_entries(entries, ["dog"], 3, bm25="lucene")[0]] == ["0", "1", "2"]
    # okapi: d2 = 0 > d1 = floor * 2.5 / (1 + 2.0625) > d0 = floor * 2.5 / (1 + 1.21875)
    assert [e.id for e in rank_entries(entries, ["dog"], 3, bm25="okapi")[0]] == ["2", "1", "0"]
    # N = 5, "beta" in 2: idf log(3.5) - log(2.5) > 0; entries 1 and 3 tie above the zeros
    ties = [MemoryEntry(str(i), text) for i, text in enumerate(["alpha", "beta", "gamma", "beta", "delta"])]
    assert [e.id for e in rank_entries(ties, ["beta"], 5, bm25="okapi")[0]] == ["1", "3", "0", "2", "4"]
    # N = 4, "beta" in 2: idf log(2.5) - log(2.5) = 0, every score is 0: memory order
    zero = [MemoryEntry(str(i), text) for i, text in enumerate(["alpha", "beta", "gamma", "beta beta"])]
    assert [e.id for e in rank_entries(zero, ["beta"], 4, bm25="okapi")[0]] == ["0", "1", "2", "3"]
    assert rank_entries(ties, ["?!"], 3, bm25="okapi") == [[]]
    with pytest.raises(ValueError, match="bm25 must be one of"):
        rank_entries(ties, ["beta"], 3, bm25="bm25plus")


# ---------------------------------------------------------------------------------------
# the k rule
# ---------------------------------------------------------------------------------------


def _lists(n_sem: int, n_epi: int) -> tuple[list[MemoryEntry], list[MemoryEntry]]:
    return [MemoryEntry(f"s{i}", "s") for i in range(n_sem)], [
        MemoryEntry(f"e{i}", "e") for i in range(n_epi)
    ]


def _table_measure(lengths: dict[int, int]):
    """A prompt whose length for ``k`` entries per list is ``lengths[k]``."""

    def measure(sem, epi):
        return lengths[max(len(sem), len(epi))]

    return measure


def test_official_rule_on_a_known_prompt_length_per_k():
    semantic, episodic = _lists(4, 2)  # k starts at 4; beyond 2 the episodic list is whole
    measure = _table_measure({0: 5, 1: 10, 2: 30, 3: 35, 4: 50})
    assert shrink_while_over(semantic, episodic, measure, 30) == (semantic[:2], episodic, True)
    assert shrink_while_over(semantic, episodic, measure, 35) == (semantic[:3], episodic, True)
    assert shrink_while_over(semantic, episodic, measure, 50) == (semantic, episodic, True)
    assert shrink_while_over(semantic, episodic, measure, 9) == ([], [], True)  # the official loop stops at 1
    assert shrink_while_over(semantic, episodic, measure, 4) == ([], [], False)
    assert shrink_while_over([], [], _table_measure({0: 7}), 7) == ([], [], True)


def test_the_two_rules_differ_where_the_length_is_not_monotone():
    semantic, episodic = _lists(3, 3)
    measure = _table_measure({0: 5, 1: 40, 2: 20, 3: 50})
    # one step at a time from the top: 3 (50) is over, 2 (20) fits
    assert K_RULES["official"].reduce(semantic, episodic, measure, 30) == (semantic[:2], episodic[:2], True)
    # bisection assumes growth: 1 (40) is over, so it settles on 0
    assert K_RULES["budget"].reduce(semantic, episodic, measure, 30) == ([], [], True)


def _official_loop(semantic, episodic, measure, limit, top_k=20):
    """The official server's loop, transcribed: start at 20, lower by one while over and k > 1."""
    k = top_k
    length = measure(semantic[:k], episodic[:k])
    while length > limit and k > 1:
        k -= 1
        length = measure(semantic[:k], episodic[:k])
    return list(semantic[:k]), list(episodic[:k]), length


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 20), st.integers(0, 20), st.lists(st.integers(0, 40), min_size=21, max_size=21),
       st.integers(0, 400))
def test_official_rule_equals_the_official_loop_wherever_that_loop_succeeds(n_sem, n_epi, steps, limit):
    semantic, episodic = _lists(n_sem, n_epi)
    lengths = np.cumsum(steps).tolist()  # prompt length for k = 0..20 (monotone, as real prompts)
    measure = _table_measure(dict(enumerate(lengths)))
    sem, epi, length = _official_loop(semantic, episodic, measure, limit)
    ours = shrink_while_over(semantic, episodic, measure, limit)
    if length <= limit:  # the official code asserts here; it fails (stops the batch) otherwise
        assert ours == (sem, epi, True)
    else:  # the official loop gave up at k = 1; memalpha goes on to k = 0
        assert ours[:2] == ([], []) and ours[2] == (lengths[0] <= limit)


# ---------------------------------------------------------------------------------------
# the reader
# ---------------------------------------------------------------------------------------


class WordReader(Reader):
    """A reader whose tokens are words; it never answers."""

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def chat(self, conversations):
        return [ReaderAnswer("", True) for _ in conversations]


def _memory() -> Memory:
    memory = Memory()
    memory.core = "The user keeps notes."
    for i in range(5):
        memory.insert(SEMANTIC, f"note {i} about the garden and its many plants")
        memory.insert(EPISODIC, f"At day {i} the user watered the garden")
    return memory


def _system_words(memory: Memory, k: int, question: str) -> int:
    ranked_sem, ranked_epi = list(memory.semantic), list(memory.episodic)  # all tie: memory order
    return len(
        answer_messages(render_answer(memory, ranked_sem[:k], ranked_epi[:k]), question)[0]["content"].split()
    )


def test_reader_official_rule_counts_the_system_prompt_against_its_limit():
    memory, question = _memory(), "garden"
    limit = _system_words(memory, 2, question)
    reader = WordReader(retrieval=RetrievalSettings(top_k_entries=5, prompt_tokens=1, k_reduction="official",
                                                 system_prompt_limit=limit))
    system = reader.answer_conversations([(memory, question)])[0][0]["content"]
    assert len(system.split()) == limit  # k = 2 fits exactly; the 1-token prompt budget plays no part
    assert "note 1 about" in system and "note 2 about" not in system
    assert "At day 1 " in system and "At day 2 " not in system
    assert reader.over_budget == 0
    # one word less and k = 1 is the most that fits
    reader.system_prompt_limit = limit - 1
    system = reader.answer_conversations([(memory, question)])[0][0]["content"]
    assert "note 0 about" in system and "note 1 about" not in system
    # the budget rule measures the whole prompt against prompt_budget_tokens instead
    budget = WordReader(
        retrieval=RetrievalSettings(top_k_entries=5, prompt_tokens=1, system_prompt_limit=limit)
    )
    system = budget.answer_conversations([(memory, question)])[0][0]["content"]
    assert "note 0" not in system and budget.over_budget == 1


def test_reader_threads_the_bm25_variant_and_the_query():
    memory = Memory()
    for text in DOG_SUN:
        memory.insert(SEMANTIC, text)

    def first_entry(reader: Reader, sources=None) -> str:
        system = reader.answer_conversations([(memory, "dog")], sources)[0][0]["content"]
        return system.split("<semantic_memory>\n", 1)[1].split("\n", 1)[0]

    assert first_entry(WordReader(retrieval=RetrievalSettings(bm25="lucene"))).endswith("dog")
    assert first_entry(WordReader(retrieval=RetrievalSettings(bm25="okapi"))).endswith("sun")
    table = QuestionInstructions({"src": "Mind the moon."})
    memory.insert(SEMANTIC, "the moon")
    # the bare question ranks "dog" first; with the instruction, "moon" matches too and wins
    assert first_entry(WordReader(question_instructions=table), ["src"]).endswith("dog")
    with_instruction = WordReader(
        question_instructions=table, retrieval=RetrievalSettings(bm25_query="with_instruction")
    )
    assert first_entry(with_instruction, ["src"]).endswith("the moon")
    assert with_instruction.bm25_query_text("dog", "Mind the moon.") == "Mind the moon.\n\ndog"
    assert with_instruction.bm25_query_text("dog", None) == "dog"


def test_reader_settings_validate_and_reach_the_reader():
    retrieval = {
        "bm25": "okapi",
        "k_reduction": "official",
        "system_prompt_limit": 123,
        "bm25_query": "with_instruction",
    }
    reader = ReaderSettings(kind="openai", retrieval=retrieval, question_instructions=None).build(None, None)
    assert (reader.bm25, reader.k_rule.name, reader.system_prompt_limit, reader.bm25_query) == (
        "okapi", "official", 123, "with_instruction")
    defaults = ReaderSettings(question_instructions=None).retrieval
    assert (defaults.bm25, defaults.k_reduction, defaults.system_prompt_limit, defaults.bm25_query) == (
        "lucene", "budget", 30000, "question")
    for option, value, message in [
        ("bm25", "bm25plus", "reader.retrieval.bm25 must be one of"),
        ("k_reduction", "halve", "reader.retrieval.k_reduction must be one of"),
        ("bm25_query", "all", "reader.retrieval.bm25_query must be one of"),
        ("system_prompt_limit", 0, "reader.retrieval.system_prompt_limit must be >= 1"),
    ]:
        with pytest.raises(ValueError, match=message):
            ReaderSettings(retrieval={option: value})
        with pytest.raises(ValueError, match=message):
            RetrievalSettings(**{option: value})
