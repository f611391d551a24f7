"""BM25 retrieval over memory entries and the prompt-budgeted top-k."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memalpha.memory.store import EPISODIC, SEMANTIC, Memory, MemoryEntry
from memalpha.reader.retrieval import fit_to_budget, rank_entries, retrieve_for_questions, tokenize

FACTS = [
    "Canberra is the capital city of Australia.",
    "The Nile is the longest river in Africa.",
    "Marie Curie won the Nobel Prize in Physics in 1903 and in Chemistry in 1911.",
    "Anna is the user's younger sister and lives in Lisbon.",
    "The user's favourite drink is green tea with honey.",
    "Mount Everest is 8,849 metres high.",
]
EVENTS = [
    "At 2024-01-03 09:00, the user started a new job at a bakery.",
    "At 2024-01-10 18:30, the user adopted a cat named Miso.",
    "At 2024-02-14 20:00, the user had dinner with Anna in Lisbon.",
]


def build_memory() -> Memory:
    memory = Memory()
    memory.core = "The user is a baker who likes tea."
    for fact in FACTS:
        memory.insert(SEMANTIC, fact)
    for event in EVENTS:
        memory.insert(EPISODIC, event)
    return memory


def test_tokenize_lowercases_words():
    assert tokenize("Anna's CAT, Miso!") == ["anna", "s", "cat", "miso"]


def test_targeted_questions_rank_the_right_entry_first():
    memory = build_memory()
    questions = [
        "What is the capital of Australia?",
        "Who is Anna?",
        "When did the user adopt a cat?",
        "How high is Mount Everest?",
        "What does the user like to drink?",
    ]
    ranked = retrieve_for_questions(memory, questions, top_k=3)
    assert len(ranked) == len(questions)
    assert ranked[0][0][0].content == FACTS[0]
    assert ranked[1][0][0].content == FACTS[3]
    assert ranked[1][1][0].content == EVENTS[2]  # the dinner with Anna
    assert ranked[2][1][0].content == EVENTS[1]
    assert ranked[3][0][0].content == FACTS[5]
    assert ranked[4][0][0].content == FACTS[4]
    for semantic, episodic in ranked:
        assert len(semantic) == 3 and len(episodic) == 3
        assert all(isinstance(e, MemoryEntry) for e in semantic + episodic)


def test_top_k_ties_and_edge_cases():
    entries = [MemoryEntry(str(i), text) for i, text in enumerate(["alpha", "beta", "gamma", "beta beta"])]
    # entries without any query word tie at 0 and keep memory order after the matches
    assert [e.id for e in rank_entries(entries, ["beta"], top_k=4)[0]] == ["3", "1", "0", "2"]
    assert [e.id for e in rank_entries(entries, ["beta"], top_k=2)[0]] == ["3", "1"]
    assert [e.id for e in rank_entries(entries, ["zeta"], top_k=2)[0]] == ["0", "1"]
    assert rank_entries(entries, ["?!"], top_k=3) == [[]]  # no word tokens: nothing to match on
    assert rank_entries([], ["beta"], top_k=3) == [[]]
    assert rank_entries(entries, ["beta"], top_k=0) == [[]]
    assert retrieve_for_questions(Memory(), ["anything"]) == [([], [])]


def _tokens(entries) -> int:
    return sum(len(e.content.split()) for e in entries)


def test_budget_shrinking_stops_at_the_budget():
    memory = build_memory()
    semantic, episodic = retrieve_for_questions(memory, ["Where does Anna live?"], top_k=6)[0]

    def measure(sem, epi):
        return 10 + _tokens(sem) + _tokens(epi)

    full = measure(semantic, episodic)
    for budget in range(9, full + 3):
        sem, epi, fits = fit_to_budget(semantic, episodic, measure, budget)
        if budget < 10:
            assert (sem, epi, fits) == ([], [], False)
            continue
        assert fits and measure(sem, epi) <= budget
        k = max(len(sem), len(epi))
        assert sem == semantic[:k] and epi == episodic[:k]
        if k < max(len(semantic), len(episodic)):  # one more entry each would not fit
            assert measure(semantic[: k + 1], episodic[: k + 1]) > budget


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(1, 30), max_size=12),
    st.lists(st.integers(1, 30), max_size=12),
    st.integers(0, 200),
    st.integers(0, 120),
)
def test_bisection_equals_shrinking_one_by_one(sem_sizes, epi_sizes, base, budget):
    semantic = [MemoryEntry(f"s{i}", "w " * n) for i, n in enumerate(sem_sizes)]
    episodic = [MemoryEntry(f"e{i}", "w " * n) for i, n in enumerate(epi_sizes)]

    def measure(sem, epi):
        return base + _tokens(sem) + _tokens(epi)

    k = max(len(semantic), len(episodic))
    while k > 0 and measure(semantic[:k], episodic[:k]) > budget:
        k -= 1
    expected_fits = measure(semantic[:k], episodic[:k]) <= budget
    sem, epi, fits = fit_to_budget(semantic, episodic, measure, budget)
    assert fits == expected_fits
    if fits:
        assert (sem, epi) == (semantic[:k], episodic[:k])
    else:
        assert (sem, epi) == ([], [])


def test_sentences_keep_the_date_an_entry_opens_with():
    from memalpha.memory.sentences import sentences

    entry = "2024-08-14 - Rosalind Whitcombe wrote a sonnet. Nikolai Ashgrove organised a chess tournament."
    assert sentences(entry) == ["2024-08-14 - Rosalind Whitcombe wrote a sonnet.",
                                "2024-08-14: Nikolai Ashgrove organised a chess tournament."]
    dated = ["On 2024-03-05, Bruno fixed a tap.", "On 2024-03-06, Ana sang!"]
    assert sentences(" ".join(dated)) == dated  # each dated already: left as they are
    undated = ["Ada moved to Lisbon.", "Bo took up chess."]
    assert sentences(" ".join(undated)) == undated
    assert sentences("Fact: Ada moved to Lisbon") == ["Fact: Ada moved to Lisbon"]
    assert sentences("  ") == []


def test_sentence_units_show_only_the_sentence_about_the_person_asked_about():
    memory = Memory()
    memory.insert(SEMANTIC, "Delphine Prendergast rented a flat on Heron Drive. "
                            "Perpetua Esterhazy rented a flat on Granary Lane.")
    memory.insert(SEMANTIC, "Perpetua Esterhazy now works as a veterinary nurse.")
    question = ["On which street did Perpetua Esterhazy rent a flat?"]
    (entries, _), = retrieve_for_questions(memory, question, top_k=1)
    assert entries[0].content.startswith("Delphine")  # the whole entry: both people's streets
    (units, _), = retrieve_for_questions(memory, question, top_k=1, unit="sentence")
    assert [u.content for u in units] == ["Perpetua Esterhazy rented a flat on Granary Lane."]
    assert units[0].id == f"{memory.semantic[0].id}.1"
    with pytest.raises(ValueError, match="unit must be one of"):
        retrieve_for_questions(memory, question, unit="word")
