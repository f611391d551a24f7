"""The extractive reader (reader.kind: extractive): the answer is the memory retrieval finds for
the question, so a substring question scores exactly when its gold is stored in a retrieved entry."""

from __future__ import annotations

import pytest

from memalpha.agent.answer_metrics import score_answer
from memalpha.memory.store import EPISODIC, SEMANTIC, Memory
from memalpha.reader.extractive import ExtractiveReader
from memalpha.reader.options import RetrievalSettings
from memalpha.reader.settings import ReaderSettings
from memalpha.train.module import GRPOModule


def two_people() -> Memory:
    memory = Memory()
    memory.insert(SEMANTIC, "Viveka Brandvold moved to Dunedin.")
    memory.insert(SEMANTIC, "Anselm Esterhazy says his favourite dish is pho.")
    memory.insert(EPISODIC, "On 2024-01-02 Viveka Brandvold started accordion lessons.")
    return memory


def test_the_answer_is_the_core_and_the_entries_ranked_first_for_the_question():
    memory = two_people()
    memory.core = "The user keeps notes on two friends."
    reader = ExtractiveReader(retrieval=RetrievalSettings(top_k_entries=1))
    city, dish = reader.answer([(memory, "Which city did Viveka Brandvold move to?"),
                                (memory, "What is Anselm Esterhazy's favourite dish?")])
    assert city.ok and city.text == ("The user keeps notes on two friends.\n"
                                     "Viveka Brandvold moved to Dunedin.\n"
                                     "On 2024-01-02 Viveka Brandvold started accordion lessons.")
    assert dish.text.splitlines()[1] == "Anselm Esterhazy says his favourite dish is pho."
    assert reader.failures == 0


def test_a_question_scores_exactly_when_its_gold_is_stored_in_a_retrieved_entry():
    memory = two_people()
    reader = ExtractiveReader(retrieval=RetrievalSettings(top_k_entries=1))
    items = [(memory, "Which city did Viveka Brandvold move to?"),  # stored, ranked first
             (memory, "Which instrument is Viveka Brandvold learning?"),  # stored (episodic list)
             (memory, "Which language is Anselm Esterhazy studying?"),  # not stored
             (memory, "What is Anselm Esterhazy's favourite dish?")]  # stored, ranked first
    golds = ["Dunedin", "accordion", "Finnish", "pho"]
    scores = [score_answer("synth_personal", a.text, g) for a, g in zip(reader.answer(items), golds)]
    assert scores == [1.0, 1.0, 0.0, 1.0]
    # with one entry per list, a stored fact that retrieval does not rank first is not found
    unrelated = reader.answer([(memory, "Who moved to Dunedin?")])[0].text
    assert "pho" not in unrelated and score_answer("synth_personal", unrelated, "pho") == 0.0


def test_an_empty_memory_answers_nothing_and_many_memories_are_answered_in_order():
    empty, full = Memory(), two_people()
    answers = ExtractiveReader().answer([(empty, "Where did Viveka move?"), (full, "Where did Viveka move?"),
                                         (empty, "What does Anselm eat?")], sources=["synth_personal"] * 3)
    assert [a.text for a in answers][0::2] == ["", ""] and all(a.ok for a in answers)
    assert "Dunedin" in answers[1].text  # the default top_k (20 a list) retrieves every entry
    with pytest.raises(ValueError, match="2 data sources for 1 reader items"):
        ExtractiveReader().answer([(full, "Where?")], sources=["a", "b"])


def test_it_answers_no_judge_prompt_and_an_llm_content_judge_is_refused_before_any_model_loads():
    reader = ReaderSettings(kind="extractive").build(policy=None, tokenizer=None)
    assert isinstance(reader, ExtractiveReader)
    with pytest.raises(RuntimeError, match="reader.kind: extractive"):  # a caller's bug, never a 0 score
        reader.complete(["Is this entry valid?"])
    assert reader.failures == 0
    with pytest.raises(ValueError, match="reward.content_judge: llm .* reader.kind: extractive"):
        GRPOModule(reader={"kind": "extractive"}, reward={"content_judge": "llm"})
    GRPOModule(reader={"kind": "extractive"})  # the rule judge needs no reader
