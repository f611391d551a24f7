"""Tool schemas, both call formats, JSON repair and the executor (every error reason)."""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memalpha.agent.memorise_prompts import memorise_messages, render_memorise
from memalpha.memory.store import Memory
from memalpha.tools.executor import ToolResult, execute_call, execute_response
from memalpha.tools.formats import ParseError, ToolCall, get_call_format
from memalpha.tools.schemas import TOOL_NAMES, TOOL_SCHEMAS

QWEN = get_call_format("qwen")
HERMES = get_call_format("hermes")
FORMATS = [QWEN, HERMES]
INSERT_ARGS = {"memory_type": "semantic_memory", "content": "Aspirin inhibits COX-1."}


def call(name: str, **arguments) -> ToolCall:
    return ToolCall(name=name, arguments=arguments, raw="")


# ------------------------------------------------------------------ schemas, formats
def test_schemas_define_the_three_tools():
    assert TOOL_NAMES == ("new_memory_insert", "memory_update", "memory_delete")
    for schema in TOOL_SCHEMAS:
        params = schema["function"]["parameters"]
        assert set(params["required"]) <= set(params["properties"])


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_instructions_are_built_from_the_schemas(fmt):
    text = fmt.instructions()
    for schema in TOOL_SCHEMAS:
        assert json.dumps(schema, ensure_ascii=False) in text


def test_get_call_format_rejects_unknown_names():
    with pytest.raises(ValueError, match="hermes"):
        get_call_format("xml")


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_render_then_parse_round_trip(fmt):
    calls = [("new_memory_insert", INSERT_ARGS),
             ("memory_update", {"memory_type": "core_memory", "new_content": 'He said "hi" ✿ {x}'}),
             ("memory_delete", {"memory_type": "episodic_memory", "memory_id": "ab12"})]
    parsed = fmt.parse("Let me store this.\n" + fmt.render_calls(calls) + "\nDone.")
    assert parsed.errors == []
    assert [(c.name, c.arguments) for c in parsed.calls] == calls
    assert not any(c.repaired for c in parsed.calls)


# ---------------------------------------------------------------------------- qwen
def test_qwen_text_after_result_is_ignored():
    text = QWEN.render_call("new_memory_insert", INSERT_ARGS) + "\n✿RESULT✿: ok\n" + \
        QWEN.render_call("memory_delete", {"memory_type": "core_memory"})
    parsed = QWEN.parse(text)
    assert [c.name for c in parsed.calls] == ["new_memory_insert"] and parsed.errors == []


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("✿FUNCTION✿: new_memory_insert\n✿ARGS✿:", "missing_args"),
        ("✿FUNCTION✿: new_memory_insert\n", "missing_args"),
        ("✿FUNCTION✿: \n✿ARGS✿: {}", "missing_name"),
        ("✿FUNCTION✿: new memory\n✿ARGS✿: {}", "bad_name"),
        ("✿FUNCTION✿: x\n✿ARGS✿: {}\n✿ARGS✿: {}", "duplicate_args"),
        ('✿FUNCTION✿: x\n✿ARGS✿: {"content": "cut off mid', "truncated"),
        ('✿FUNCTION✿: x\n✿ARGS✿: {"content":', "truncated"),
        ("✿FUNCTION✿: x\n✿ARGS✿: [1, 2]", "not_object"),
        ('✿FUNCTION✿: x\n✿ARGS✿: {"a" "b"}', "invalid_json"),
        ('✿ARGS✿: {"a": 1}', "missing_name"),
    ],
)
def test_qwen_malformed_parts_are_reported(text, code):
    parsed = QWEN.parse(text)
    assert parsed.calls == [] and len(parsed.errors) == 1
    assert parsed.errors[0].code == code and parsed.errors[0].reason


def test_qwen_dangling_call_after_good_one_is_reported_not_dropped():
    text = QWEN.render_call("new_memory_insert", INSERT_ARGS) + "\n✿FUNCTION✿: new_memory_insert\n✿ARGS✿:"
    parsed = QWEN.parse(text)
    assert len(parsed.calls) == 1 and [e.code for e in parsed.errors] == ["missing_args"]


@pytest.mark.parametrize(
    ("args", "expected", "repair"),
    [
        ('{"memory_type": "semantic_memory", "content": "x",}', {"memory_type": "semantic_memory",
                                                                "content": "x"}, "trailing comma"),
        ("{'memory_type': 'semantic_memory', 'content': 'it\\'s'}", {"memory_type": "semantic_memory",
                                                                    "content": "it's"}, "single quotes"),
        ('{"memory_type": "semantic_memory", "content": "x"', {"memory_type": "semantic_memory",
                                                              "content": "x"}, "closing bracket"),
        ('{"memory_type": "semantic_memory", "content": "line1\nline2"}',
         {"memory_type": "semantic_memory", "content": "line1\nline2"}, "control characters"),
    ],
)
def test_light_repairs_are_applied_and_reported(args, expected, repair):
    parsed = QWEN.parse(f"✿FUNCTION✿: new_memory_insert\n✿ARGS✿: {args}")
    assert parsed.errors == [] and parsed.calls[0].arguments == expected
    assert parsed.calls[0].repaired and any(repair in r for r in parsed.calls[0].repairs)


def test_code_fence_and_trailing_prose_are_not_repairs():
    parsed = QWEN.parse('✿FUNCTION✿: memory_delete\n✿ARGS✿: ```json\n{"memory_type": "core_memory"}\n```')
    assert parsed.calls[0].arguments == {"memory_type": "core_memory"} and not parsed.calls[0].repaired
    parsed = QWEN.parse('✿FUNCTION✿: memory_delete\n✿ARGS✿: {"memory_type": "core_memory"}\nAll done.')
    assert parsed.calls[0].arguments == {"memory_type": "core_memory"} and parsed.errors == []


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_thinking_is_ignored(fmt):
    inner = fmt.render_call("memory_delete", {"memory_type": "core_memory"})
    real = fmt.render_call("new_memory_insert", INSERT_ARGS)
    assert [c.name for c in fmt.parse(f"<think>maybe {inner}</think>\n{real}").calls] == ["new_memory_insert"]
    assert [c.name for c in fmt.parse(f"reasoning {inner}</think>{real}").calls] == ["new_memory_insert"]
    parsed = fmt.parse(f"{real}<think>unfinished {inner}")
    assert len(parsed.calls) + len(parsed.errors) == 1


# -------------------------------------------------------------------------- hermes
def test_hermes_missing_closing_tag_and_back_to_back_blocks():
    body = json.dumps({"name": "new_memory_insert", "arguments": INSERT_ARGS})
    parsed = HERMES.parse(f"<tool_call>{body}<tool_call>{body}")
    assert len(parsed.calls) == 2 and parsed.errors == []


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ('</tool_call>', "unbalanced_tags"),
        ('<tool_call>{"arguments": {}}</tool_call>', "missing_name"),
        ('<tool_call>{"name": "memory_delete"}</tool_call>', "missing_args"),
        ('<tool_call>{"name": "memory_delete", "arguments": [1]}</tool_call>', "not_object"),
        ('<tool_call>{"name": "memory_delete", "arguments": "{\\"a\\": "}</tool_call>', "truncated"),
        ('<tool_call>{"name": "new_memory_insert", "arguments": {"content": "cut', "truncated"),
        ("<tool_call></tool_call>", "empty"),
        ("<tool_call>memory_delete(core)</tool_call>", "not_object"),
    ],
)
def test_hermes_malformed_blocks_are_reported(text, code):
    parsed = HERMES.parse(text)
    assert parsed.calls == [] and [e.code for e in parsed.errors] == [code]


def test_hermes_arguments_as_json_string_are_decoded_and_flagged():
    body = json.dumps({"name": "new_memory_insert", "arguments": json.dumps(INSERT_ARGS)})
    parsed = HERMES.parse(f"<tool_call>\n{body}\n</tool_call>")
    assert parsed.calls[0].arguments == INSERT_ARGS and parsed.calls[0].repaired


# ------------------------------------------------------------------------ executor
@pytest.mark.parametrize(
    ("bad_call", "code"),
    [
        (call("memory_search", query="x"), "unknown_tool"),
        (call("new_memory_insert", memory_type="semantic_memory"), "missing_argument"),
        (call("new_memory_insert", memory_type="semantic_memory", content="x", tags="y"), "extra_argument"),
        (call("new_memory_insert", memory_type="semantic_memory", content=3), "wrong_type"),
        (call("memory_delete", memory_type=["core_memory"]), "wrong_type"),
        (call("new_memory_insert", memory_type="semantic", content="x"), "bad_memory_type"),
        (call("new_memory_insert", memory_type="core_memory", content="x"), "insert_into_core"),
        (
            call("memory_update", memory_type="semantic_memory", new_content="x", memory_id="none"),
            "unknown_id",
        ),
        (call("memory_delete", memory_type="episodic_memory", memory_id="none"), "unknown_id"),
        (call("memory_delete", memory_type="episodic_memory"), "missing_argument"),
        (call("memory_update", memory_type="semantic_memory", new_content="x"), "missing_argument"),
        (call("new_memory_insert", memory_type="episodic_memory", content="  \n"), "empty_content"),
        (call("memory_update", memory_type="core_memory", new_content=""), "empty_content"),
        (call("new_memory_insert", memory_type="episodic_memory", content="bad \ud800 text"), "invalid_text"),
    ],
)
def test_every_error_reason(bad_call, code):
    memory = Memory()
    memory.insert("semantic_memory", "existing")
    before = memory.to_dict()
    result = execute_call(memory, bad_call)
    assert (result.status, result.code) == ("error", code) and result.reason
    assert memory.to_dict() == before


def test_unknown_id_says_when_the_id_is_in_the_other_list():
    memory = Memory()
    entry = memory.insert("episodic_memory", "At 9:00 user ran.")
    result = execute_call(memory, call("memory_delete", memory_type="semantic_memory", memory_id=entry.id))
    assert result.code == "unknown_id" and "episodic_memory" in result.reason


def test_successful_operations_and_skips():
    memory = Memory(core_token_limit=20)
    ok = execute_call(memory, call("new_memory_insert", **INSERT_ARGS))
    assert (ok.status, ok.memory_id) == ("ok", memory.semantic[0].id)
    assert execute_call(memory, call("new_memory_insert", **INSERT_ARGS)).status == "skipped"
    entry_id = ok.memory_id
    upd = call("memory_update", memory_type="semantic_memory", new_content="COX", memory_id=entry_id)
    assert execute_call(memory, upd).status == "ok" and memory.semantic[0].content == "COX"
    assert execute_call(memory, upd).status == "skipped"
    core = call("memory_update", memory_type="core_memory", new_content="word " * 50, memory_id="ignored")
    result = execute_call(memory, core)
    assert result.status == "ok" and "cut to 20 tokens" in result.reason
    assert execute_call(memory, call("memory_delete", memory_type="core_memory")).status == "ok"
    assert execute_call(memory, call("memory_delete", memory_type="core_memory")).status == "skipped"
    delete = call("memory_delete", memory_type="semantic_memory", memory_id=entry_id)
    assert execute_call(memory, delete).status == "ok" and memory.semantic == []
    assert execute_call(memory, delete).code == "unknown_id"  # official code would say ok


def test_update_to_text_of_another_item_is_skipped():
    memory = Memory()
    a = memory.insert("semantic_memory", "a")
    b = memory.insert("semantic_memory", "b")
    result = execute_call(memory, call("memory_update", memory_type="semantic_memory", new_content="a",
                                       memory_id=b.id))
    assert result.status == "skipped" and a.id in result.reason and b.content == "b"


def test_turn_counts_parse_errors_as_failed_calls():
    text = QWEN.render_calls([("new_memory_insert", INSERT_ARGS), ("new_memory_insert", INSERT_ARGS),
                              ("memory_delete", {"memory_type": "semantic_memory", "memory_id": "zz"})])
    outcome = execute_response(Memory(), text + "\n✿FUNCTION✿: memory_update\n✿ARGS✿: {\"memory_t", QWEN)
    assert [r.status for r in outcome.results] == ["ok", "skipped", "error"]
    assert (outcome.successes, outcome.attempts) == (2, 4)
    assert execute_response(Memory(), "No calls.", QWEN).attempts == 0


# ------------------------------------------------------------------------- prompts
@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_memorise_messages(fmt):
    memory = Memory()
    memory.insert("semantic_memory", "fact")
    messages = memorise_messages(render_memorise(memory), "the chunk text", fmt, response_token_limit=300)
    assert [m["role"] for m in messages] == ["system", "user"]
    assert render_memorise(memory) in messages[0]["content"]
    assert fmt.instructions() in messages[0]["content"]
    assert "<new_chunk>\nthe chunk text\n</new_chunk>" in messages[1]["content"]
    assert "300 tokens" in messages[1]["content"]
    # the memory (the only part that differs between rollouts) ends the system prompt, after the
    # tool block, so the fixed text before it is one prefix shared by every turn of a batch
    system = messages[0]["content"]
    assert system.endswith(render_memorise(memory))
    assert system.index(fmt.instructions()) < system.index(render_memorise(memory))


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_compact_profile_keeps_every_tool_argument_and_the_layout(fmt):
    from memalpha.tools.schemas import TOOL_SCHEMAS

    compact = fmt.instructions(compact=True)
    assert len(compact) < len(fmt.instructions()) / 2
    for schema in TOOL_SCHEMAS:  # every tool, argument and choice of the schemas is still named
        function = schema["function"]
        assert function["name"] in compact
        for name, spec in function["parameters"]["properties"].items():
            assert name in compact and all(choice in compact for choice in spec.get("enum", ()))
    assert "memory_id?: string" in compact  # optional arguments are marked
    memory = Memory()
    memory.insert("episodic_memory", "On 2024-01-01, Anna moved.")
    messages = memorise_messages(
        render_memorise(memory), "the chunk", fmt, response_token_limit=90, detail="compact"
    )
    assert compact in messages[0]["content"] and messages[0]["content"].endswith(render_memorise(memory))
    assert (
        "<new_chunk>\nthe chunk\n</new_chunk>" in messages[1]["content"]
        and "90 tokens" in messages[1]["content"]
    )
    with pytest.raises(ValueError, match="prompt detail"):
        memorise_messages(render_memorise(memory), "x", fmt, detail="tiny")


# ---------------------------------------------------------------- property-based
_SAFE_TEXT = st.text(alphabet=st.characters(blacklist_characters="✿<>", blacklist_categories=("Cs",)),
                     max_size=40)
_ARGUMENTS = st.fixed_dictionaries(
    {"memory_type": st.sampled_from(["semantic_memory", "episodic_memory", "core_memory", "bogus"])},
    optional={"content": _SAFE_TEXT, "new_content": _SAFE_TEXT, "memory_id": _SAFE_TEXT,
              "extra": st.integers()},
)


def _mutate(text: str, data) -> str:
    kind = data.draw(st.sampled_from(["truncate", "delete", "insert", "none"]))
    if kind == "none" or not text:
        return text
    i = data.draw(st.integers(0, len(text)))
    if kind == "truncate":
        return text[:i]
    if kind == "delete":
        j = data.draw(st.integers(i, len(text)))
        return text[:i] + text[j:]
    return text[:i] + data.draw(st.text(alphabet="{}[]\"',:\\ \nabc", max_size=5)) + text[i:]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fmt=st.sampled_from(FORMATS), blocks=st.lists(
    st.tuples(st.sampled_from(list(TOOL_NAMES) + ["bogus_tool"]), _ARGUMENTS, st.booleans()),
    max_size=5), data=st.data())
def test_property_every_call_is_parsed_or_reported_and_executes_safely(fmt, blocks, data):
    pieces, kept = [], []
    for name, arguments, mutate in blocks:
        rendered = fmt.render_call(name, arguments)
        if mutate:  # corrupt only the argument JSON, keep the call's frame
            payload = json.dumps(arguments if fmt is QWEN else {"name": name, "arguments": arguments},
                                 ensure_ascii=False)
            rendered = rendered.replace(payload, _mutate(payload, data))
        else:
            kept.append((name, arguments))
        pieces.append(rendered)
    text = "\n".join(pieces)
    parsed = fmt.parse(text)
    assert len(parsed.calls) + len(parsed.errors) == len(blocks)
    got = iter([(c.name, c.arguments) for c in parsed.calls])
    assert all(item in got for item in kept)  # intact calls come out unchanged, in order
    memory = Memory(core_token_limit=16)
    for parsed_call in parsed.calls:
        snapshot = copy.deepcopy(parsed_call.arguments)
        before = memory.to_dict()
        result = execute_call(memory, parsed_call)
        assert isinstance(result, ToolResult) and result.status in {"ok", "skipped", "error"}
        assert parsed_call.arguments == snapshot
        if result.status != "ok":
            assert memory.to_dict() == before
    assert all(isinstance(e, ParseError) and e.reason for e in parsed.errors)


@settings(max_examples=150, deadline=None)
@given(fmt=st.sampled_from(FORMATS), text=st.one_of(
    st.text(alphabet=st.characters(blacklist_categories=())),
    st.binary().map(lambda b: b.decode("utf-8", errors="surrogateescape")),
    st.lists(st.sampled_from(["✿FUNCTION✿", "✿ARGS✿", ": ", "✿RESULT✿", "<tool_call>", "</tool_call>",
                              "<think>", "</think>", "{", "}", "[", "]", '"', "'", ",", "\\", "name",
                              "arguments", "memory_delete", "x", "\n", ":"]), max_size=60).map("".join),
))
def test_property_parse_never_raises(fmt, text):
    parsed = fmt.parse(text)
    memory = Memory()
    for parsed_call in parsed.calls:
        assert execute_call(memory, parsed_call).status in {"ok", "skipped", "error"}


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_parse_survives_huge_and_deep_input(fmt):
    deep = "✿FUNCTION✿: x\n✿ARGS✿: " + '{"a":' + "[" * 50_000 if fmt is QWEN else \
        '<tool_call>{"name": "x", "arguments": ' + "[" * 50_000 + "</tool_call>"
    parsed = fmt.parse(deep)
    assert len(parsed.calls) + len(parsed.errors) == 1
    huge = fmt.render_call(
        "new_memory_insert", {"memory_type": "semantic_memory", "content": "z" * 2_000_000}
    )
    parsed = fmt.parse(huge[:1_000_000])
    assert parsed.calls == [] and len(parsed.errors) == 1
    assert parsed.errors[0].code == "truncated" and len(parsed.errors[0].raw) < 3000
    assert fmt.parse(None).errors[0].code == "not_text"  # type: ignore[arg-type]
