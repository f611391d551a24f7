"""memalpha's reward that measures memory (issue 30) and fact recall, against hand-computed numbers.

r2 counts a call only when it changed the memory with a text its chunk supports; r4 gives a
write that its chunk does not support 0; r3 pays compression in proportion to r1. The chunk below
tells one fact; its wrapper's words ("keep in mind", "User") support nothing.
"""

from __future__ import annotations

from datetime import date

import pytest

from memalpha.agent.content_judges import RuleContentJudge
from memalpha.agent.fact_recall import fact_recall, instance_facts, memory_fact_recall
from memalpha.agent.reward_math import (
    TurnCalls,
    chunk_tokens,
    is_supported,
    rollout_rewards,
    tool_success_reward,
)
from memalpha.agent.reward_settings import RewardSettings
from memalpha.data.wrapping import wrap_chunk
from memalpha.memory.store import Memory
from memalpha.tools.executor import execute_call
from memalpha.tools.formats import ParseError, ToolCall

CHUNK = wrap_chunk(
    "Anselm Esterhazy signed up for evening classes in Finnish. "
    "There was a long queue at the post office today.",
    "dialogue",
    date(2024, 4, 14),
)
# content tokens of CHUNK:
# 2024 04 14 anselm esterhazy signed evening classes finnish long queue post office today
SUPPORTED = "Anselm Esterhazy takes Finnish evening classes."  # 5 of its 6 tokens in the chunk ("takes" not)
GENERIC = "The user shared some information today."  # user shared information today: 1 of 4


def call(name: str, **arguments) -> ToolCall:
    return ToolCall(name=name, arguments=arguments, raw="")


def insert(text: str, memory_type: str = "semantic_memory") -> ToolCall:
    return call("new_memory_insert", memory_type=memory_type, content=text)


DELETE_CORE = call("memory_delete", memory_type="core_memory")


def r2(memory: Memory, *calls: ToolCall, errors: int = 0) -> float:
    results = [execute_call(memory, c) for c in calls]
    parse_errors = [ParseError(reason="arguments are not JSON", raw="{oops")] * errors
    return tool_success_reward(
        TurnCalls(results=results, parse_errors=parse_errors, chunk=CHUNK), RewardSettings()
    )


def test_the_chunk_supports_what_it_tells_and_not_its_wrapper():
    source = chunk_tokens(CHUNK)
    assert source == {
        "2024", "04", "14", "anselm", "esterhazy", "signed", "evening", "classes", "finnish", "long", "queue",
        "post", "office", "today",
    }
    rule = {"min_share": 0.5, "min_tokens": 2}
    assert is_supported(SUPPORTED, source, **rule)  # 5 / 6
    assert not is_supported(GENERIC, source, **rule)  # 1 / 4, and fewer than 2
    # the wrapper's words
    assert not is_supported("Here is something new to keep in mind, user.", source, **rule)
    assert is_supported("Finnish classes.", source, **rule)  # 2 / 2
    assert not is_supported("Finnish.", source, **rule)  # 1 < min_tokens
    assert not is_supported("Anselm Esterhazy likes jazz, chess, opera and sailing.", source, **rule)  # 2 / 7
    assert is_supported(
        "Anselm Esterhazy likes jazz, chess, opera and sailing.", source, min_share=0.25, min_tokens=2
    )


def test_a_write_that_says_a_sentence_twice_is_not_supported():
    """The loop GRPO taught the 135M policy (docs/results.md, tool_success): the same facts again and
    again until the reply is cut. A second copy adds nothing; a loop's call is lost when cut."""
    from memalpha.agent.reward_math import repeats_itself

    source, rule = chunk_tokens(CHUNK), {"min_share": 0.5, "min_tokens": 2}
    loop = "Anselm Esterhazy signed up for Finnish classes. There was a queue at the post office. " * 2
    assert repeats_itself(loop) and not is_supported(loop, source, **rule)
    assert repeats_itself("Finnish classes today. finnish CLASSES, today!")  # case and punctuation aside
    assert not repeats_itself("Anselm signed up. Anselm signed up for Finnish.")  # a longer sentence is new
    assert not repeats_itself("Yes. Yes. Anselm Esterhazy signed up.")  # one-word sentences left out
    assert is_supported("Anselm Esterhazy signed up for Finnish classes. The post office had a queue.",
                        source, **rule)


def test_r2_counts_changes_of_memory_that_the_chunk_supports():
    # a skipped call (deleting an empty core) is no success: 0 / 1
    assert r2(Memory(), DELETE_CORE) == 0.0
    # a supported insert: 1 / 1
    assert r2(Memory(), insert(SUPPORTED)) == 1.0
    # an insert the chunk does not support: 0 / 1, though it changed the memory
    assert r2(Memory(), insert(GENERIC)) == 0.0
    # a repeated insert is skipped: the first succeeds, the repeat does not: 1 / 2
    assert r2(Memory(), insert(SUPPORTED), insert(SUPPORTED)) == 0.5
    # an update to the text already there changes nothing: alone in its turn, 0
    memory = Memory()
    entry = execute_call(memory, insert(SUPPORTED))
    same = call(
        "memory_update", memory_type="semantic_memory", memory_id=entry.memory_id, new_content=SUPPORTED
    )
    assert r2(memory, same) == 0.0
    # supported insert, skipped delete, unsupported insert, one parse error: 1 / 4
    assert r2(Memory(), insert(SUPPORTED), DELETE_CORE, insert(GENERIC), errors=1) == 0.25
    # a deletion that changes the memory counts only in a turn that stores something of its chunk
    memory = Memory()
    old = execute_call(memory, insert("Mia Lund moved to Lisbon."))
    delete_old = call("memory_delete", memory_type="semantic_memory", memory_id=old.memory_id)
    assert r2(memory, delete_old) == 0.0
    memory = Memory()
    old = execute_call(memory, insert("Mia Lund moved to Lisbon."))
    delete_old = call("memory_delete", memory_type="semantic_memory", memory_id=old.memory_id)
    assert r2(memory, insert(SUPPORTED), delete_old) == 1.0


def test_an_update_is_judged_by_what_it_adds():
    memory = Memory()
    memory.set_core("Mia Lund moved to Lisbon and adopted a puppy called Biscuit.")
    grown = "Mia Lund moved to Lisbon and adopted a puppy called Biscuit. Anselm Esterhazy studies Finnish."
    # added: anselm esterhazy studies finnish, 3 of 4 in the chunk; the whole text would be 3 of 11
    assert r2(memory, call("memory_update", memory_type="core_memory", new_content=grown)) == 1.0
    assert not is_supported(grown, chunk_tokens(CHUNK), min_share=0.5, min_tokens=2)
    # the official and status rules are unchanged by the support rule
    for rule in ("status", "official"):
        turn = TurnCalls(results=[execute_call(Memory(), DELETE_CORE)])
        assert tool_success_reward(turn, RewardSettings(call_success=rule)) == 1.0


def test_hand_computed_rollout_under_memalpha_rules():
    memory = Memory()
    turn1 = TurnCalls(
        results=[execute_call(memory, insert(SUPPORTED)), execute_call(memory, DELETE_CORE)], chunk=CHUNK
    )
    turn2 = TurnCalls(results=[execute_call(memory, insert(GENERIC))], chunk=CHUNK)
    reward = rollout_rewards([1.0, 0.0], [turn1, turn2], memory_tokens=20, chunk_tokens=100,
                             weights=RewardSettings(), content_judge=RuleContentJudge())
    assert reward.r1 == pytest.approx(0.5)
    assert reward.r3 == pytest.approx(0.5 * 0.8)  # compression 1 - 20/100, paid in proportion to r1
    assert reward.r2 == pytest.approx([1 / 2, 0.0])
    # the generic sentence is a valid semantic statement for the rule judge, but not of this chunk
    assert reward.r4 == pytest.approx([1 / 2, 0.0])
    assert reward.total == pytest.approx([0.5 + 0.5 + 0.05 * 0.4 + 0.1 * 0.5, 0.5 + 0.0 + 0.05 * 0.4 + 0.0])
    # the gate: no answer, no compression; a memory larger than the input keeps its penalty
    empty = rollout_rewards([0.0], [TurnCalls(chunk=CHUNK)], 0, 100, RewardSettings(), None)
    assert empty.r3 == 0.0 and empty.total == [0.0]
    bloated = rollout_rewards([0.0], [TurnCalls(chunk=CHUNK)], 150, 100, RewardSettings(), None)
    assert bloated.r3 == pytest.approx(-0.5)
    # the official profile's settings: the paper's r3, the judge's r4, the official r2
    official = RewardSettings(call_success="official", content_grounding="none", compression_gate="none")
    paper = rollout_rewards([0.0], [turn2], 0, 100, official, RuleContentJudge())
    assert paper.r3 == 1.0 and paper.r2 == [1.0] and paper.r4 == [1.0]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"support_min_share": 0.0}, "support_min_share"),
        ({"support_min_share": 1.5}, "support_min_share"),
        ({"support_min_tokens": 0}, "support_min_tokens"),
        ({"content_grounding": "judge"}, "content_grounding"),
        ({"compression_gate": "r1"}, "compression_gate"),
        ({"call_success": "lenient"}, "call_success"),
    ],
)
def test_support_settings_are_checked(options, message):
    with pytest.raises(ValueError, match=f"reward.{message}"):
        RewardSettings(**options)


def test_a_turn_without_its_chunk_cannot_be_judged_by_the_support_rule():
    with pytest.raises(ValueError, match="chunk"):
        tool_success_reward(TurnCalls(results=[execute_call(Memory(), insert(SUPPORTED))]), RewardSettings())


# ------------------------------------------------------------------------------ fact recall

FACTS = [
    "Anselm Esterhazy signed up for evening classes in Finnish.",
    "2024-10-07 Rosalind Montgomery installed a rain barrel.",
]


def test_fact_recall_hand_computed():
    # fact 1: 5 of its 6 tokens in one entry (0.83 >= 0.8); fact 2 without its date: 5 of 8 (0.625)
    assert fact_recall(FACTS, [SUPPORTED, "Rosalind Montgomery installed a rain barrel."]) == 0.5
    assert (
        fact_recall(FACTS, [SUPPORTED, "On 2024-10-07 Rosalind Montgomery installed a rain barrel."]) == 1.0
    )
    # words scattered over two items do not add up to a fact
    assert fact_recall(FACTS[:1], ["Anselm Esterhazy signed up.", "Evening classes in Finnish."]) == 0.0
    assert fact_recall(FACTS, []) == 0.0 and fact_recall([], [SUPPORTED]) == 0.0


def test_fact_recall_reads_the_notes_and_knows_when_there_are_none():
    notes = [[{"memory_type": "semantic_memory", "fact": FACTS[0]}],
             [{"memory_type": "episodic_memory", "fact": "Rosalind Montgomery installed a rain barrel.",
               "date": "2024-10-07"}]]
    assert instance_facts({"notes": notes}) == FACTS
    assert instance_facts({}) is None and instance_facts({"notes": []}) is None
    memory = Memory()
    memory.set_core("Notes: " + SUPPORTED)
    assert memory_fact_recall({"notes": notes}, memory) == 0.5
    assert memory_fact_recall({"source": "squad"}, memory) is None  # no facts: no recall, not 0


def _record(instance_id: str, source: str, recall: float | None):
    from memalpha.agent.rollout import RolloutRecord

    return RolloutRecord(
        instance_id,
        source,
        0,
        [{"chunk_index": 0, "response": "", "results": [], "reward": 1.0}],
        {},
        10,
        100,
        [{"score": 1.0}],
        fact_recall=recall,
    )


def test_fact_recall_is_logged_per_round_and_reported_beside_accuracy():
    import torch

    from memalpha.agent.rollout import RolloutOutput, TurnSample
    from memalpha.train.step import round_metrics
    from memalpha.train.validation_report import format_table, summarise_records

    records = [
        _record("a", "synth_personal", 1.0),
        _record("b", "synth_personal", 0.5),
        _record("c", "squad", None),
    ]
    summary = summarise_records(records)
    assert summary["overall"]["fact_recall"] == 0.75 and summary["overall"]["fact_recall_rollouts"] == 2
    assert summary["per_source"]["squad"]["fact_recall"] is None  # no known facts: nothing, not 0
    lines = {line.split()[0]: line.split() for line in format_table(summary).splitlines()}
    assert lines["source"][5] == "fact_recall"
    assert lines["synth_personal"][5] == "0.750" and lines["squad"][5] == "-" and lines["ALL"][5] == "0.750"
    sample = TurnSample(0, 0, 0, [1], [2], False, 0, 0)
    out = RolloutOutput([sample], records, rollout_s=1.0, reader_s=0.0, generated_tokens=1)
    one = torch.tensor([1.0])
    metrics = round_metrics(out, one, (one, torch.tensor([0])))
    assert metrics["train/fact_recall"] == 0.75
    out.records = records[2:]
    assert "train/fact_recall" not in round_metrics(out, one, (one, torch.tensor([0])))
