"""The reward orders scripted memories by what they hold (issue 30), through the real rollout.

Four scripted policies write every turn of held-out synthetic instances (memalpha_lab.scripted);
their replies are parsed, executed, read by a model-free reader that answers with the memory it
was shown, and rewarded. Under the default reward the oracle (the gold facts) earns most, copying
whole chunks less (no compression), and a policy that deletes the empty core or inserts one fixed
sentence at most half the oracle's reward, below the 6-step SFT start of the learning curve
(held-out mean reward 1.134, experiments/results/learning_curve_q4.json). The rule before issue 30
paid those two 1.05 and 1.15.
"""

from __future__ import annotations

import pytest

from memalpha.agent.reward_settings import RewardSettings
from memalpha.agent.rollout_settings import RolloutSettings
from memalpha.data.synthetic import generate_synthetic
from memalpha.reader.extractive import ExtractiveReader
from memalpha.tools.formats import get_call_format
from memalpha_lab.scripted import POLICIES, ScriptedSampler, reward_terms, run_scripted

SFT_START_REWARD = 1.134  # docs/results.md, learning_curve with 4 questions: step 0 (SFT, 6 steps)


@pytest.fixture(scope="module")
def instances():
    return generate_synthetic(
        8,
        split="validation",
        num_chunks=2,
        facts_per_chunk=2,
        distractors_per_chunk=0,
        questions_per_instance=4,
        chunk_words=60,
        families=("synth_personal", "synth_timeline"),
    )


@pytest.fixture(scope="module")
def settings():
    return RolloutSettings(group_size=1, max_new_tokens=112, max_prompt_tokens=1536, call_format="hermes",
                           prompt_profile="compact", core_token_limit=128)


def terms(policy, instances, tokenizer, settings, reward):
    return reward_terms(run_scripted(policy, instances, tokenizer, ExtractiveReader(), settings, reward))


def test_the_default_reward_ranks_the_oracle_first_and_pays_no_memory_nothing(instances, tokenizer, settings):
    got = {name: terms(name, instances, tokenizer, settings, RewardSettings()) for name in POLICIES}
    oracle = got["oracle"]["R"]
    assert oracle > got["copy"]["R"] > got["generic"]["R"]
    for name in ("content_free", "generic"):
        assert got[name]["R"] <= oracle / 2 and got[name]["R"] < SFT_START_REWARD, got
        assert got[name]["fact_recall"] == 0.0 and got[name]["r2"] == 0.0 and got[name]["r3"] == 0.0
    assert got["oracle"]["fact_recall"] == got["copy"]["fact_recall"] == 1.0
    assert got["copy"]["r3"] == pytest.approx(0.0, abs=0.01)  # the memory is the input
    assert got["oracle"]["r3"] > 0.5 and got["oracle"]["r2"] == 1.0 and got["oracle"]["r4"] == 1.0


def test_the_rule_before_issue_30_paid_a_memory_without_content(instances, tokenizer, settings):
    before = RewardSettings(call_success="status", content_grounding="none", compression_gate="none")
    content_free = terms("content_free", instances, tokenizer, settings, before)
    generic = terms("generic", instances, tokenizer, settings, before)
    # r2 = 1 from skipped calls, r3 = 1 from an empty memory: 0 + 1 + 0.05
    assert content_free["R"] == pytest.approx(1.05)
    assert generic["R"] == pytest.approx(1.15, abs=0.01) and generic["R"] > SFT_START_REWARD


def test_the_engine_finds_the_chunk_being_read_after_a_copied_one(instances, tokenizer, settings):
    """Turn 2 of the copy policy shows chunk 1 in its memory and reads chunk 2: it copies chunk 2."""
    out = run_scripted("copy", instances[:1], tokenizer, ExtractiveReader(), settings, RewardSettings())
    memory = out.records[0].memory
    assert [e["content"] for e in memory["episodic"]] == instances[0].chunks
    engine = ScriptedSampler(POLICIES["oracle"], instances, tokenizer, get_call_format("hermes"))
    with pytest.raises(ValueError, match="no scripted instance"):
        engine.locate("a prompt about something else")


def test_each_answer_says_whether_the_memory_holds_it_and_where_its_evidence_is(
    instances, tokenizer, settings
):
    from memalpha.train.validation_report import summarise_records

    reader, reward = ExtractiveReader(), RewardSettings()
    oracle_out = run_scripted("oracle", instances, tokenizer, reader, settings, reward)
    generic_out = run_scripted("generic", instances, tokenizer, reader, settings, reward)
    for out, held in ((oracle_out, True), (generic_out, False)):
        for record, instance in zip(out.records, instances):
            assert [q["stored"] for q in record.questions] == [held] * len(instance.questions)
            assert [q["evidence_chunk"] for q in record.questions] == \
                [e[0] for e in instance.metadata["evidence_chunks"]]
            assert all(turn["prompt_tokens"] <= settings.max_prompt_tokens for turn in record.turns)
    oracle = summarise_records(oracle_out.records)["overall"]
    assert oracle["stored"] == 1.0 and oracle["stored_accuracy"] == oracle["accuracy"]
    nothing = summarise_records(generic_out.records)["overall"]
    assert nothing["stored"] == 0.0 and nothing["stored_accuracy"] is None
