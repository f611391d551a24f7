"""The Mem-alpha reward: a hand-computed two-turn, two-question rollout, and the content judges."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from memalpha.agent.content_judges import (
    JUDGEMENT_OBJECTS,
    LLMContentJudge,
    RuleContentJudge,
    has_time_expression,
    parse_validity_judgement,
    rule_validity,
)
from memalpha.agent.reward_math import (
    TurnCalls,
    accuracy_reward,
    compression_reward,
    content_rewards,
    gated_compression,
    judged_verdicts,
    parsed_calls,
    rollout_rewards,
    tool_success_reward,
    turn_totals,
)
from memalpha.agent.reward_settings import RewardSettings
from memalpha.memory.store import Memory
from memalpha.reader.base import Reader, ReaderAnswer, ReaderSampling
from memalpha.reader.options import RetrievalSettings
from memalpha.templates.loader import default_templates
from memalpha.tools.executor import ToolResult, execute_response
from memalpha.tools.formats import ParseError, ToolCall, get_call_format


def call(name: str, **arguments) -> ToolCall:
    return ToolCall(name=name, arguments=arguments, raw="")


SISTER = call(
    "new_memory_insert", memory_type="semantic_memory", content="Anna is the user's younger sister."
)
HIKE = call("new_memory_insert", memory_type="episodic_memory", content="The user went hiking with Anna.")
CORE_SELF = call("memory_update", memory_type="core_memory", new_content="The core memory has been updated.")
DELETE = call("memory_delete", memory_type="semantic_memory", memory_id="zz99")
CAT = call(
    "new_memory_insert", memory_type="episodic_memory", content="At 2024-01-05 10:00, the user adopted a cat."
)


# the terms without memalpha's support rule and accuracy gate (memalpha before issue 30): the
# paper's r3 and r4, r2 counting ok and skipped calls; test_memory_reward.py checks memalpha's rule
UNGROUNDED = {"call_success": "status", "content_grounding": "none", "compression_gate": "none"}


def two_turns() -> list[TurnCalls]:
    turn1 = TurnCalls(
        results=[ToolResult("ok", "", SISTER), ToolResult("ok", "", HIKE)],
        parse_errors=[ParseError(reason="arguments are not JSON", raw="✿ARGS✿: {oops")],
    )
    turn2 = TurnCalls(
        results=[
            ToolResult("ok", "", CORE_SELF),
            ToolResult("error", "no entry zz99", DELETE),
            ToolResult("skipped", "identical content exists", CAT),
        ]
    )
    return [turn1, turn2]


def test_hand_computed_two_turn_two_question_rollout():
    reward = rollout_rewards(
        question_scores=[1.0, 0.5],
        turns=two_turns(),
        memory_tokens=200,
        chunk_tokens=1000,
        weights=RewardSettings(beta=0.05, gamma=0.1, **UNGROUNDED),
        content_judge=RuleContentJudge(),
    )
    # r1 = (1 + 0.5) / 2; r3 = 1 - 200/1000
    assert reward.r1 == pytest.approx(0.75)
    assert reward.r3 == pytest.approx(0.8)
    # turn 1: 2 ok of 3 calls (1 parse error); content: sister fact valid, hike has no time -> 1/2
    # turn 2: ok + skipped of 3; content: core about itself 0, delete 0, dated cat event 1 -> 1/3
    assert reward.r2 == pytest.approx([2 / 3, 2 / 3])
    assert reward.r4 == pytest.approx([1 / 2, 1 / 3])
    # R_t = r1 + r2_t + 0.05 r3 + 0.1 r4_t
    assert reward.total == pytest.approx([0.75 + 2 / 3 + 0.04 + 0.05, 0.75 + 2 / 3 + 0.04 + 0.1 / 3])


def test_accuracy_weight_scales_r1_against_the_tool_reward():
    weights = RewardSettings(beta=0.05, gamma=0.1, accuracy_weight=3.0, **UNGROUNDED)
    reward = rollout_rewards([1.0, 0.5], two_turns(), 200, 1000, weights, RuleContentJudge())
    assert reward.r1 == pytest.approx(0.75)  # the term itself is reported unweighted
    # R_t = 3 r1 + r2_t + 0.05 r3 + 0.1 r4_t
    assert reward.total == pytest.approx([2.25 + 2 / 3 + 0.04 + 0.05, 2.25 + 2 / 3 + 0.04 + 0.1 / 3])
    with pytest.raises(ValueError, match="reward.accuracy_weight must be >= 0, got -1"):
        RewardSettings(accuracy_weight=-1)


def test_weights_turns_without_calls_and_compression_sign():
    empty = TurnCalls()
    reward = rollout_rewards(
        [0.0, 1.0],
        [empty],
        memory_tokens=1500,
        chunk_tokens=1000,
        weights=RewardSettings(beta=0.2, gamma=1.0, **UNGROUNDED),
        content_judge=RuleContentJudge(),
    )
    assert reward.r2 == [0.0] and reward.r4 == [0.0]
    assert reward.r3 == pytest.approx(-0.5)  # memory larger than the input: negative
    assert reward.total == pytest.approx([0.5 - 0.1])
    # gamma = 0 or no judge: r4 reported as 0 without judging
    no_judge = rollout_rewards(
        [1.0], two_turns(), 0, 10, RewardSettings(gamma=0.0, **UNGROUNDED), RuleContentJudge()
    )
    assert no_judge.r4 == [0.0, 0.0]
    assert rollout_rewards([], two_turns(), 0, 10, RewardSettings(**UNGROUNDED), None).r1 == 0.0
    # a result without a call counts in r2's and r4's denominators with score 0
    odd = rollout_rewards([1.0], [TurnCalls(results=[ToolResult("error", "not an object", None),
                                                      ToolResult("ok", "", SISTER)])],
                          0, 10, RewardSettings(**UNGROUNDED), RuleContentJudge())
    assert odd.r2 == [0.5] and odd.r4 == [0.5]
    with pytest.raises(ValueError, match="chunk_tokens"):  # turns over no input: a bug, not a reward
        rollout_rewards([1.0], two_turns(), 10, 0, RewardSettings(**UNGROUNDED), None)
    # nothing read and no turn (a memory already written, the memories layout): no compression
    assert rollout_rewards([1.0], [], 10, 0, RewardSettings(), None).r3 == 0.0


def test_rewards_from_real_parsed_turns():
    """The reward consumes what the parser and executor produce."""
    fmt = get_call_format("qwen")
    memory = Memory()
    response = (
        fmt.render_calls(
            [
                (
                    "new_memory_insert",
                    {"memory_type": "semantic_memory", "content": "Paris is the capital of France."},
                ),
                (
                    "new_memory_insert",
                    {"memory_type": "semantic_memory", "content": "Paris is the capital of France."},
                ),
                ("memory_delete", {"memory_type": "episodic_memory", "memory_id": "nope"}),
            ]
        )
        + "\n✿FUNCTION✿: new_memory_insert\n✿ARGS✿:"
    )
    outcome = execute_response(memory, response, fmt)
    turn = TurnCalls(results=outcome.results, parse_errors=outcome.errors)
    assert [r.status for r in outcome.results] == ["ok", "skipped", "error"]
    assert len(outcome.errors) == 1
    reward = rollout_rewards(
        [1.0], [turn], memory.total_tokens(), 100, RewardSettings(**UNGROUNDED), RuleContentJudge()
    )
    assert reward.r2 == pytest.approx([2 / 4])
    assert reward.r4 == pytest.approx([2 / 3])
    # memalpha's rule, the chunk telling the fact: only the first insert changed the memory
    told = replace(turn, chunk="We learned in class that Paris is the capital of France.")
    reward = rollout_rewards([1.0], [told], memory.total_tokens(), 100, RewardSettings(), RuleContentJudge())
    assert reward.r2 == pytest.approx([1 / 4])
    assert reward.r4 == pytest.approx([2 / 3])  # both inserts write a supported, valid text; the delete 0


def test_each_term_from_plain_values():
    """r1..r4 and R_t one at a time, from numbers and verdicts given by hand (no judge)."""
    assert accuracy_reward([1.0, 0.5, 0.0]) == pytest.approx(0.5) and accuracy_reward([]) == 0.0
    assert compression_reward(250, 1000) == pytest.approx(0.75)
    assert gated_compression(0.75, 0.4, "accuracy") == pytest.approx(0.3)  # 0.4 * 0.75
    assert gated_compression(-0.5, 0.4, "accuracy") == -0.5  # a negative r3 stays whole
    assert gated_compression(0.75, 0.4, "none") == 0.75
    status = RewardSettings(call_success="status", content_grounding="none")
    turns = two_turns()
    assert [tool_success_reward(t, status) for t in turns] == pytest.approx([2 / 3, 2 / 3])
    assert parsed_calls(turns) == [SISTER, HIKE, CORE_SELF, DELETE, CAT]
    # the judge's verdicts by hand: turn 1 (1 + 0.5) / 2, turn 2 (0 + 0 + 1) / 3
    assert content_rewards(turns, [1.0, 0.5, 0.0, 0.0, 1.0], status) == pytest.approx([0.75, 1 / 3])
    assert content_rewards(turns, None, status) == [0.0, 0.0]  # not judged
    # R_t = 2 * 0.5 + r2_t + 0.1 * 0.3 + 0.5 * r4_t
    weights = RewardSettings(accuracy_weight=2.0, beta=0.1, gamma=0.5)
    assert turn_totals(0.5, [1.0, 0.0], 0.3, [0.5, 1.0], weights) == pytest.approx([2.28, 1.53])


def test_the_judge_is_asked_only_when_r4_counts():
    class Counting:
        def __init__(self, scores):
            self.scores, self.asked = scores, []

        def judge(self, calls):
            self.asked.append(list(calls))
            return list(self.scores)

    weights = RewardSettings(**UNGROUNDED)
    judge = Counting([1.0] * 5)
    assert judged_verdicts(two_turns(), weights, judge) == [1.0] * 5 and len(judge.asked) == 1
    assert judged_verdicts(two_turns(), replace(weights, gamma=0.0), judge) is None
    assert judged_verdicts([TurnCalls()], weights, judge) is None and len(judge.asked) == 1
    assert judged_verdicts(two_turns(), weights, None) is None
    with pytest.raises(RuntimeError, match="content judge returned 2 scores for 5 calls"):
        judged_verdicts(two_turns(), weights, Counting([1.0, 0.0]))


@pytest.mark.parametrize(
    ("kind", "content", "valid"),
    [
        ("core", "The user is a nurse in Porto who loves sailing.", True),
        ("core", "", False),
        ("core", "This is the core memory of the user.", False),
        ("core", "Summary goes here.", False),
        ("core", "[insert summary]", False),
        ("semantic", "Water boils at 100 degrees Celsius.", True),
        ("semantic", "TBD", False),
        ("semantic", "   ", False),
        ("semantic", "ok", False),
        ("episodic", "On Monday the user visited the dentist.", True),
        ("episodic", "At 14:30 the user called the bank.", True),
        ("episodic", "Two weeks ago the user moved to Berlin.", True),
        ("episodic", "The user likes cats a lot.", False),
    ],
)
def test_rule_validity(kind, content, valid):
    assert rule_validity(kind, content)[0] is valid


def test_time_expressions():
    assert has_time_expression("[Dialogue on 2024-01-05 00:00] user said hi")
    assert has_time_expression("In March the user got married")
    assert not has_time_expression("The user has a brother named Tom")


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ('```json\n{"VALID": true, "ISSUES": [], "EXPLANATION": "a fact"}\n```', True),
        ('{"VALID": false, "ISSUES": ["no time"], "EXPLANATION": "no time"}', False),
        ('```json\n{"VALID": "yes", "ISSUES": [], "EXPLANATION": "x"}\n```', None),  # not a bool
        ('```json\n{"VALID": true}\n```', None),  # missing keys
        ("VALID: true", None),
        ('```json\n{"VALID": true, "ISSUES": [], \n```', None),  # broken JSON
        ("", None),
    ],
)
def test_parse_validity_judgement(reply, expected):
    assert parse_validity_judgement(reply) is expected


class ScriptedJudge(Reader):
    """A deterministic reader backend: judges an entry valid when it contains a digit."""

    def __init__(self):
        super().__init__(retrieval=RetrievalSettings(top_k_entries=5, prompt_tokens=10_000))
        self.prompts: list[str] = []

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def chat(self, conversations):
        out = []
        for conv in conversations:
            prompt = conv[-1]["content"]
            self.prompts.append(prompt)
            entry = prompt.split("Entry:\n", 1)[1].split("\n\nReply", 1)[0]
            if "MALFORMED" in entry:
                out.append(ReaderAnswer("I think it is fine.", True, None))
            elif "DOWN" in entry:
                out.append(ReaderAnswer("", False, "HTTP 500"))
            else:
                verdict = {"VALID": any(c.isdigit() for c in entry), "ISSUES": [], "EXPLANATION": "checked"}
                out.append(ReaderAnswer("```json\n" + json.dumps(verdict) + "\n```", True, None))
        return out


def test_llm_content_judge_batches_and_scores_malformed_as_zero():
    reader = ScriptedJudge()
    judge = LLMContentJudge(reader)
    calls = [
        CAT,  # has digits -> valid
        SISTER,  # no digit -> invalid
        DELETE,  # not asked: deletions score 0
        call("new_memory_insert", memory_type="semantic_memory", content="MALFORMED 1"),
        call("new_memory_insert", memory_type="semantic_memory", content="DOWN 1"),
        call("new_memory_insert", memory_type="semantic_memory", content=""),  # not asked
    ]
    assert judge.judge(calls) == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert len(reader.prompts) == 4  # one batch, four prompts
    assert "episodic memory" in reader.prompts[0] and "semantic memory" in reader.prompts[1]
    assert judge.malformed == 2
    reward = rollout_rewards([1.0], two_turns(), 0, 10, RewardSettings(**UNGROUNDED), judge)
    # turn 1: sister 0, hike 0 ; turn 2: core 0, delete 0, cat 1
    assert reward.r4 == pytest.approx([0.0, 1 / 3])


# ---------------------------------------------------------------------------------------
# the judge's retry and sampling (official difference 4)
# ---------------------------------------------------------------------------------------

VALID_REPLY = '```json\n{"VALID": true, "ISSUES": [], "EXPLANATION": "fine"}\n```'
INVALID_REPLY = '```json\n{"VALID": false, "ISSUES": ["vague"], "EXPLANATION": "no"}\n```'
# made-up stand-ins for an imported file's judge texts: the rules as the system message, the
# entry as the user message, and the text appended to the user message before asking again
SPLIT = replace(
    default_templates(),
    content_judge_system="RULES: {rules}",
    content_judge="NOTE ({kind}): {content}",
    content_judge_retry="\n\nSTAND-IN RETRY {{json}}.",
    source="stand-in",
)
RETRY = "\n\nSTAND-IN RETRY {json}."


class ReplayJudge(Reader):
    """Records every conversation and sampling setting it gets; answers each entry from its
    script in turn (``None``: a failed reader call)."""

    def __init__(self, script: dict[str, list[str | None]], templates=SPLIT):
        super().__init__(templates=templates)
        self.script = {entry: list(replies) for entry, replies in script.items()}
        self.batches: list[tuple[list, ReaderSampling | None]] = []

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def chat(self, conversations, sampling=None):
        self.batches.append((list(conversations), sampling))
        out = []
        for conversation in conversations:
            entry = conversation[-1]["content"].split(": ", 1)[1].split("\n\n", 1)[0]
            reply = self.script[entry].pop(0)
            out.append(ReaderAnswer("", False, "HTTP 500") if reply is None else ReaderAnswer(reply, True))
        return out


def insert(content: str) -> ToolCall:
    return call("new_memory_insert", memory_type="semantic_memory", content=content)


def test_the_judge_asks_again_only_for_malformed_writes_with_the_retry_text_and_its_sampling():
    reader = ReplayJudge({
        "alpha": ["not JSON", VALID_REPLY],  # malformed once, then valid
        "beta": [INVALID_REPLY],  # well-formed at once: never asked again
        "gamma": ["still not", "nope", "no JSON either", VALID_REPLY],  # three malformed: gives up
        "delta": [None, "not JSON", VALID_REPLY],  # a failed call adds no retry text
    })
    settings = RewardSettings(content_judge="llm", content_judge_attempts=3, content_judge_temperature=0.1,
                              content_judge_max_tokens=512)
    judge = settings.build_content_judge(reader)
    calls = [insert("alpha"), insert("beta"), DELETE, insert("gamma"), insert("delta")]
    assert judge.judge(calls) == [1.0, 0.0, 0.0, 0.0, 1.0]
    rules = "RULES: " + default_templates().render("content_judge_semantic")

    def conversation(entry: str, retries: int) -> list[dict[str, str]]:
        return [{"role": "system", "content": rules},
                {"role": "user", "content": f"NOTE (semantic): {entry}" + RETRY * retries}]

    assert [batch for batch, _ in reader.batches] == [
        [
            conversation("alpha", 0),
            conversation("beta", 0),
            conversation("gamma", 0),
            conversation("delta", 0),
        ],
        [conversation("alpha", 1), conversation("gamma", 1), conversation("delta", 0)],
        [conversation("gamma", 2), conversation("delta", 1)],
    ]
    official = ReaderSampling(temperature=0.1, max_tokens=512)
    assert [sampling for _, sampling in reader.batches] == [official] * 3
    assert reader.script["gamma"] == [VALID_REPLY]  # the fourth reply was never asked for
    assert judge.malformed == 1 + 3 + 2 and judge.unjudged == 1
    assert sum(len(batch) for batch, _ in reader.batches) == 9 and reader.failures == 1


def test_one_attempt_asks_once_as_before():
    script = {"alpha": ["not JSON", VALID_REPLY], "beta": [VALID_REPLY]}
    reader = ReplayJudge(script)
    judge = RewardSettings(content_judge="llm").build_content_judge(reader)
    assert judge.judge([insert("alpha"), insert("beta")]) == [0.0, 1.0]
    assert len(reader.batches) == 1 and reader.batches[0][1] is None  # the reader's own sampling
    assert all(RETRY not in m["content"] for m in reader.batches[0][0][0])
    assert judge.malformed == 1 and judge.unjudged == 1
    # memalpha's texts (no retry text) and no judge sampling: the very call of before
    sent = []
    plain = ReplayJudge(script, templates=None)
    plain.complete = lambda prompts, **options: sent.append((list(prompts), options)) or [
        ReaderAnswer(VALID_REPLY, True) for _ in prompts]
    assert RewardSettings(content_judge="llm").build_content_judge(plain).judge([insert("beta")]) == [1.0]
    assert sent == [
        (
            [
                default_templates().render(
                    "content_judge",
                    kind="semantic",
                    content="beta",
                    rules=default_templates().render("content_judge_semantic"),
                )
            ],
            {},
        )
    ]


def test_without_a_retry_text_the_same_messages_are_asked_again():
    reader = ReplayJudge(
        {"alpha": ["not JSON", "not JSON"]}, templates=replace(SPLIT, content_judge_retry=None)
    )
    judge = LLMContentJudge(reader, attempts=2)
    assert judge.judge([insert("alpha")]) == [0.0]
    assert reader.batches[0][0] == reader.batches[1][0]
    assert judge.malformed == 2 and judge.unjudged == 1


@pytest.mark.parametrize(
    ("reply", "memalpha", "official"),
    [
        (VALID_REPLY, True, True),
        (INVALID_REPLY, False, False),
        ('{"VALID": true, "ISSUES": [], "EXPLANATION": "bare"}', True, None),  # no fence
        ('```\n{"VALID": true, "ISSUES": [], "EXPLANATION": "untagged"}\n```', True, None),  # no json tag
        # the first fence is read as is
        ('<think>```json\n{"VALID": false}\n```</think>' + VALID_REPLY, True, None),
        # ISSUES not a list
        ('```json\n{"VALID": true, "ISSUES": "none", "EXPLANATION": "x"}\n```', None, None),
    ],
)
def test_the_official_parse_needs_a_json_fence(reply, memalpha, official):
    assert parse_validity_judgement(reply) is memalpha
    assert parse_validity_judgement(reply, JUDGEMENT_OBJECTS["memalpha"]) is memalpha
    assert parse_validity_judgement(reply, JUDGEMENT_OBJECTS["official"]) is official


def test_the_judge_uses_its_parse():
    bare = '{"VALID": true, "ISSUES": [], "EXPLANATION": "bare"}'
    assert LLMContentJudge(ReplayJudge({"alpha": [bare]})).judge([insert("alpha")]) == [1.0]
    judge = RewardSettings(content_judge="llm", content_judge_parse="official").build_content_judge(
        ReplayJudge({"alpha": [bare]}))
    assert judge.judge([insert("alpha")]) == [0.0] and judge.malformed == 1


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"content_judge_attempts": 0}, "reward.content_judge_attempts must be >= 1, got 0"),
        (
            {"content_judge_temperature": -0.1},
            "reward.content_judge_temperature must be >= 0 (0 = greedy) or null, got -0.1",
        ),
        ({"content_judge_max_tokens": 0}, "reward.content_judge_max_tokens must be >= 1 or null, got 0"),
        (
            {"content_judge_parse": "loose"},
            "reward.content_judge_parse must be one of ['memalpha', 'official'], got 'loose'",
        ),
    ],
)
def test_judge_settings_are_checked_with_one_line_errors(options, message):
    with pytest.raises(ValueError) as info:
        RewardSettings(**options)
    assert str(info.value) == message
