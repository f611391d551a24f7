"""Difference 6 of docs/official_compatibility.md: truncated and malformed calls, under both policies.

``strict`` (memalpha's default) refuses a call cut off inside its arguments, reports a call with
no arguments and refuses extra arguments; ``json_repair`` (the official profile) reads arguments
as the official Mem-α code does: through the ``json-repair`` package (a cut-off call stores the
prefix it keeps and succeeds), a call with no arguments dropped silently, extra arguments
ignored. Each rule is checked on hand-made responses under both policies, and the real recorded
responses (tests/fixtures/memalpha4b_pubmed) pin what each policy makes of the official run.
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from memalpha.agent.rollout_settings import RolloutSettings
from memalpha.memory.store import Memory
from memalpha.tools.executor import execute_response
from memalpha.tools.formats import ToolCall, get_call_format
from memalpha.tools.jsonfix import CALL_REPAIRS, JSON_REPAIR, trim_after_last_brace
from memalpha.train.profiles import PROFILES

FIXTURE = Path(__file__).parent / "fixtures" / "memalpha4b_pubmed"
_NEW_ID = re.compile(r"'new_memory': \{'([0-9a-f]+)':")
QWEN = get_call_format("qwen")
HERMES = get_call_format("hermes")
CUT = (
    '✿FUNCTION✿: new_memory_insert\n✿ARGS✿: {"memory_type": "semantic_memory", "content": "Marta lives in Lis'
)
WHOLE = '✿FUNCTION✿: new_memory_insert\n✿ARGS✿: {"memory_type": "semantic_memory", "content": "Tom is 40."}'


def _run(response: str, call_repair: str, fmt=QWEN):
    memory = Memory(seed=0)
    return memory, execute_response(memory, response, fmt, CALL_REPAIRS[call_repair])


# ------------------------------------------------------------------ the official rules, hand-made inputs
def test_cut_off_call_is_refused_by_strict_and_stored_as_its_prefix_by_json_repair():
    memory, outcome = _run(CUT, "strict")
    assert [e.code for e in outcome.errors] == ["truncated"] and not outcome.parsed.calls
    assert (outcome.successes, outcome.attempts) == (0, 1) and memory.semantic == []

    memory, outcome = _run(CUT, "json_repair")
    assert not outcome.errors and outcome.parsed.calls[0].repaired
    assert (outcome.successes, outcome.attempts) == (1, 1)
    assert [entry.content for entry in memory.semantic] == ["Marta lives in Lis"]


@pytest.mark.parametrize(("text", "value"), [
    ('{"content": "cut off', {"content": "cut off"}),  # cut inside a string: strict says truncated
    ('{"a":', {"a": ""}),  # cut after a key: strict says truncated
    ('{"a" "b"}', {"a": "b"}),  # not JSON: strict says invalid_json
    ('{"a": tru}', {"a": "tru"}),
])
def test_the_json_repair_package_cannot_refuse_so_strict_keeps_its_own_pass(text, value):
    """Why ``strict`` does not call the package (the comment above ``jsonfix._repair``): it makes a
    value of every text, and logs no repair for single quotes, trailing commas or missing brackets.
    If a release changes that, this test says so."""
    from json_repair import repair_json

    from memalpha.tools.jsonfix import read_json_object

    assert repair_json(text, return_objects=True) == value
    assert read_json_object(text).code in ("truncated", "invalid_json")
    for repaired in ("{'a': 'b'}", '{"a": [1, 2,],}', '{"a": {"b": 1'):
        assert repair_json(repaired, return_objects=True, logging=True)[1] == []
        assert read_json_object(repaired).repairs


def test_json_repair_cuts_after_the_last_brace_as_the_official_code_does():
    """A cut-off content holding ``}`` keeps only the text before that brace: the official code trims
    after the last ``}``, and the package then reads that brace as the end of the object."""
    text = '{"memory_type": "semantic_memory", "content": "set {a} was used, then b'
    assert trim_after_last_brace(text) == '{"memory_type": "semantic_memory", "content": "set {a}'
    memory, outcome = _run(f"✿FUNCTION✿: new_memory_insert\n✿ARGS✿: {text}", "json_repair")
    assert outcome.successes == 1 and [entry.content for entry in memory.semantic] == ["set {a"]


@pytest.mark.parametrize("dangling, strict_code", [
    ("✿FUNCTION✿: new_memory_insert\n✿ARGS✿:", "missing_args"),  # as in the recorded run
    ("✿FUNCTION✿: new_memory_insert\n✿ARGS✿:  \n", "missing_args"),
    ("✿FUNCTION✿: new_memory_insert\n✿ARGS✿:\n✿RESULT✿: ok", "missing_args"),
    ("✿FUNCTION✿: new_memory_insert", "missing_args"),
    ("✿FUNCTION✿:", "missing_name"),
])
def test_call_without_arguments_at_the_end_is_reported_by_strict_and_dropped_by_json_repair(
    dangling, strict_code
):
    response = f"{WHOLE}\n{dangling}"
    _, strict = _run(response, "strict")
    assert [e.code for e in strict.errors] == [strict_code] and (strict.successes, strict.attempts) == (1, 2)
    memory, official = _run(response, "json_repair")
    assert not official.errors and (official.successes, official.attempts) == (1, 1)
    assert [entry.content for entry in memory.semantic] == ["Tom is 40."]


@pytest.mark.parametrize("call_repair", CALL_REPAIRS)
def test_empty_arguments_before_another_call_fail_under_both_policies(call_repair):
    """The official parser reads an empty argument string there and fails to decode it."""
    _, outcome = _run(f"✿FUNCTION✿: new_memory_insert\n✿ARGS✿:\n{WHOLE}", call_repair)
    assert (outcome.successes, outcome.attempts) == (1, 2) and len(outcome.errors) == 1


def test_extra_arguments_are_refused_by_strict_and_ignored_by_json_repair():
    arguments = {"memory_type": "semantic_memory", "content": "Tom is 40.", "importance": "high"}
    response = QWEN.render_call("new_memory_insert", arguments)
    memory, strict = _run(response, "strict")
    assert [r.code for r in strict.results] == ["extra_argument"] and memory.semantic == []
    memory, official = _run(response, "json_repair")
    assert [r.status for r in official.results] == ["ok"]
    assert [entry.content for entry in memory.semantic] == ["Tom is 40."]
    assert official.parsed.calls[0].arguments == arguments  # the parsed call itself is not modified


@pytest.mark.parametrize("call_repair", CALL_REPAIRS)
def test_wrong_argument_type_is_refused_under_both_policies(call_repair):
    """The official code would store the number as it is; memalpha's store holds text only."""
    response = QWEN.render_call("new_memory_insert", {"memory_type": "semantic_memory", "content": 40})
    memory, outcome = _run(response, call_repair)
    assert [r.code for r in outcome.results] == ["wrong_type"] and memory.semantic == []


@pytest.mark.parametrize("call_repair", CALL_REPAIRS)
def test_complete_calls_read_the_same_under_both_policies(call_repair):
    memory, outcome = _run(WHOLE, call_repair)
    assert not outcome.parsed.calls[0].repaired and [e.content for e in memory.semantic] == ["Tom is 40."]


def test_hermes_blocks_follow_the_same_rules():
    cut = (
        '<tool_call>\n{"name": "new_memory_insert", '
        '"arguments": {"memory_type": "semantic_memory", "content": "Tom is'
    )
    _, strict = _run(f"{cut}", "strict", HERMES)
    assert [e.code for e in strict.errors] == ["truncated"]
    memory, official = _run(cut, "json_repair", HERMES)
    assert official.successes == 1 and [e.content for e in memory.semantic] == ["Tom is"]
    _, empty = _run("<tool_call>\n</tool_call>", "strict", HERMES)
    assert empty.attempts == 1 and empty.errors
    _, empty = _run("<tool_call>\n</tool_call>", "json_repair", HERMES)
    assert empty.attempts == 0


def test_an_unknown_setting_is_refused():
    with pytest.raises(ValueError, match="rollout.call_repair"):
        RolloutSettings(call_repair="lenient")


def test_default_profile_keeps_strict_and_official_profile_repairs():
    assert RolloutSettings().call_repair == "strict"
    assert "model.rollout.call_repair" not in PROFILES["memalpha"]
    assert PROFILES["official"]["model.rollout.call_repair"] == "json_repair"


def test_json_repair_never_raises_and_yields_objects_on_random_cuts():
    """Every prefix of a rendered response, under every policy: parsed, never raised, objects only."""
    rng = random.Random(6)
    rendered = QWEN.render_calls(
        [
            ("memory_update", {"memory_type": "core_memory", "new_content": 'a "q" {b} [c]'}),
            ("new_memory_insert", {"memory_type": "episodic_memory", "content": "x\\y\nz"}),
        ]
    )
    for cut in sorted(rng.sample(range(len(rendered) + 1), 120)):
        for call_repair in CALL_REPAIRS:
            parsed = QWEN.parse(rendered[:cut], CALL_REPAIRS[call_repair])
            assert all(
                isinstance(call, ToolCall) and isinstance(call.arguments, dict) for call in parsed.calls
            )


_AUDITED = """
import json, sys
from memalpha.tools.executor import execute_response
from memalpha.tools.jsonfix import JSON_REPAIR
from memalpha.tools.formats import get_call_format
from memalpha.memory.store import Memory
texts = [
    '✿FUNCTION✿: new_memory_insert\\n✿ARGS✿: {"memory_type": "semantic_memory", "content": "/etc/passwd',
    '✿FUNCTION✿: new_memory_insert\\n✿ARGS✿: {"memory_type": "semantic_memory", '
        '"content": "__import__(\\'os\\')',
    '✿FUNCTION✿: memory_update\\n✿ARGS✿: {\\'memory_type\\': \\'core_memory\\', \\'new_content\\': \\'file:///x',
    '<tool_call>{"name": "new_memory_insert", '
        '"arguments": "{\\\\"memory_type\\\\": \\\\"episodic_memory\\\\", \\\\"content\\\\": \\\\"x',
    '✿FUNCTION✿: memory_delete\\n✿ARGS✿: ' + '[' * 5000,
]
events = []
sys.addaudithook(lambda event, args: events.append(event))
memory = Memory(seed=0)
stored = 0
for text in texts:
    fmt = get_call_format("hermes" if text.startswith("<") else "qwen")
    stored += execute_response(memory, text, fmt, JSON_REPAIR).successes
seen = sorted(set(events))
compile("1", "<canary>", "eval")  # the hook is live: this one must be seen
print(json.dumps({"events": seen, "canary": sorted(set(events) - set(seen)), "stored": stored}))
"""


def test_json_repair_policy_opens_runs_and_imports_nothing(tmp_path):
    """The sandbox of docs/method.md under the official policy: the package only parses the string."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent), "PYTHONDONTWRITEBYTECODE": "1",
           "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", _AUDITED], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report == {"events": [], "canary": ["compile"], "stored": 4}
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------ the real recorded responses
def _turns() -> list[dict]:
    lines = (FIXTURE / "responses.jsonl").read_text(encoding="utf-8").splitlines()
    return sorted(
        (json.loads(line) for line in lines if line.strip()), key=lambda t: (t["instance_id"], t["chunk_idx"])
    )


def _replay(call_repair: str) -> tuple[dict[str, Memory], Counter]:
    memories: dict[str, Memory] = {}
    tally: Counter = Counter()
    for turn in _turns():
        memory = memories.setdefault(turn["instance_id"], Memory(seed=0))
        outcome = execute_response(memory, turn["raw_response"], QWEN, CALL_REPAIRS[call_repair])
        tally["attempted"] += outcome.attempts
        tally["successes"] += outcome.successes
        tally["repaired"] += sum(call.repaired for call in outcome.parsed.calls)
        tally["turns_all_succeeded"] += 0 < outcome.attempts == outcome.successes
        tally.update(f"error:{error.code}" for error in outcome.errors)
        tally.update(f"status:{result.status}" for result in outcome.results)
    return memories, tally


@pytest.mark.parametrize("call_repair, expected", [
    ("strict", {"attempted": 80, "successes": 68, "turns_all_succeeded": 18, "status:ok": 44,
                "status:skipped": 24, "error:truncated": 11, "error:missing_args": 1}),
    ("json_repair", {"attempted": 79, "successes": 79, "repaired": 11, "turns_all_succeeded": 30,
                     "status:ok": 55, "status:skipped": 24}),
])
def test_recorded_turns_score_as_pinned(call_repair, expected):
    """The numbers in docs/official_compatibility.md (difference 6): 30 turns, 79 recorded calls, 11 cut
    off."""
    assert +_replay(call_repair)[1] == Counter(expected)


def test_json_repair_stores_exactly_what_the_official_run_stored():
    """All 11 cut-off calls store the official text, so the final memories equal the official ones."""
    official = json.loads((FIXTURE / "final_memory.json").read_text(encoding="utf-8"))
    stored = {eid: text for memory in official.values() for part in ("semantic", "episodic")
              for item in memory[part] for eid, text in item.items()}
    memories: dict[str, Memory] = {}
    same = cut = 0
    for turn in _turns():
        memory = memories.setdefault(turn["instance_id"], Memory(seed=0))
        outcome = execute_response(memory, turn["raw_response"], QWEN, JSON_REPAIR)
        assert len(outcome.results) == len(turn["calls"])  # one result per recorded call, in order
        for recorded, result in zip(turn["calls"], outcome.results):
            if not recorded["arguments_complete_json"]:
                cut += 1
                ours = memory.find(result.call.arguments["memory_type"], result.memory_id).content
                same += ours == stored[_NEW_ID.search(recorded["official_result"]).group(1)]
    assert (cut, same) == (11, 11)
    for instance_id, memory in memories.items():
        expected = official[instance_id]
        assert memory.core == expected["core"]
        for ours, theirs in (
            (memory.semantic, expected["semantic"]),
            (memory.episodic, expected["episodic"]),
        ):
            assert [entry.content for entry in ours] == [text for item in theirs for text in item.values()]
