"""The tool sandbox (issue 16, item 6): tool calls reach only the in-memory store, and no input breaks it.

The model writes the tool calls, so every byte of them is untrusted. These tests push hostile
responses through the real parser of every call format and the executor:

* path-like, URL-like and code-like text (``/etc/passwd``, ``file:///``, ``__import__('os')``...):
  stored verbatim as text, never opened, fetched or run;
* huge content (10 MB values, 1 MB keys and tool names) and 10,000-level JSON nesting;
* lone surrogates, wrong JSON types for every argument, unknown tools;
* 10,000 seeded random calls against one memory, each call's effect checked against what its
  result reports.

Nothing may raise, every call gets a result with a status and a short, printable reason, and
after every phase :func:`assert_store_consistent` holds.
:func:`test_executor_path_opens_runs_and_connects_nothing` repeats all phases (with 3,000
random calls) in a fresh interpreter under a :func:`sys.addaudithook` hook (hooks cannot be
removed, hence the subprocess) and requires that they raise no audit event at all: no
``open``, ``socket.*``, ``exec``/``compile``, ``subprocess.Popen``, ``os.*`` or even an ``import``.
"""

from __future__ import annotations

import ast
import json
import os
import random
import subprocess
import sys
from collections import Counter
from operator import attrgetter
from pathlib import Path

import pytest

from memalpha.agent.memorise_prompts import render_memorise
from memalpha.memory.store import CORE, EPISODIC, LIST_TYPES, SEMANTIC, Memory
from memalpha.reader.answer_prompts import render_answer
from memalpha.tools.executor import ToolResult, execute_call, execute_response
from memalpha.tools.formats import (
    CALL_FORMATS,
    CallFormat,
    ParseError,
    ParseResult,
    ToolCall,
    get_call_format,
)
from memalpha.tools.schemas import DELETE, INSERT, TOOL_NAMES, UPDATE, tool_parameters

FORMATS = [get_call_format(name) for name in sorted(CALL_FORMATS)]
CORE_LIMIT = 64
REASON_LIMIT = 500  # characters: a reason names the problem, it never carries the model's text
RAW_LIMIT = 2100  # a parse error keeps at most 2,000 characters of the raw call (plus a note)
STATUSES = {"ok", "skipped", "error"}
REPO = Path(__file__).resolve().parents[1]
PACKAGE_DIRS = [REPO / "memalpha" / "memory", REPO / "memalpha" / "tools"]

PATH_LIKE = [
    "/etc/passwd", "../../x", "..\\..\\boot.ini", "file:///etc/shadow", "http://127.0.0.1:1/",
    "https://example.invalid/a?b=c", "~/.ssh/id_rsa", "/dev/zero", "/proc/self/environ",
    "C:\\Windows\\win.ini", "\\\\host\\share\\file", "pwned", "./pwned", "$(touch pwned)",
    "`touch pwned`", "; touch pwned",
    "__import__('os').system('touch pwned')", "open('pwned', 'w').write('x')", "{{7*7}}", "${HOME}",
    "\x00/etc/passwd",
]
UNKNOWN_TOOLS = [
    "eval", "exec", "open", "__import__", "os.system", "subprocess.run", "read_file", "fetch_url",
    "memory_search", "MEMORY_DELETE", "memory-delete", "memory_delete\u200b", "new_memory_insert()",
    "new_memory_insert\x00", "/etc/passwd", "file:///etc/passwd", "http://127.0.0.1:1/",
]
WRONG_TYPE_VALUES = [None, True, False, 0, -1, 1.5, float("inf"), [], ["semantic_memory"], {}, {"a": "b"},
                     10**4000]
SURROGATE_TEXTS = ["\ud800", "\udfff", "a\udc80b", "\ud800\ud800", "fact \udfff\ud800 end"]
VALID_EXOTIC_TEXTS = ["\x00", "\uffff", "\U0010ffff", "\ufeffBOM", "\u202eright-to-left", "e\u0301\u0301",
                      "✿FUNCTION✿ inside", "</tool_call> inside", "<think> inside", "line\nbreak\ttab"]
WORDS = ["Marta", "lives", "in", "Lisbon", "since", "2019", "aspirin", "inhibits", "COX-1", "the", "meeting",
         "moved", "to", "Friday", "ünïcødé", "✿", "\"quoted\"", "{braces}", "[list]", "back\\slash"]


# ------------------------------------------------------------------------ invariants
def assert_store_consistent(memory: Memory) -> None:
    """What must hold after any sequence of calls: unique ids, the core cap, a lossless save, rendering."""
    ids = [entry.id for entry in memory.semantic + memory.episodic]
    assert len(ids) == len(set(ids)), "an id is used twice"
    for kind in LIST_TYPES:
        contents = [entry.content for entry in memory.entries(kind)]
        assert len(contents) == len(set(contents)), f"{kind} holds the same text twice"
        for content in contents:
            assert isinstance(content, str) and content.strip(), f"{kind} holds an empty entry"
            content.encode("utf-8")  # only valid Unicode text is ever stored
    assert isinstance(memory.core, str)
    memory.core.encode("utf-8")
    assert memory.token_counter(memory.core) <= memory.core_token_limit, "core over its token limit"
    saved = memory.to_dict()
    text = json.dumps(saved, ensure_ascii=False)  # how a memory is written to a UTF-8 file
    text.encode("utf-8")
    assert json.loads(text) == saved
    everything = memory.semantic + memory.episodic
    view = render_memorise(memory, k=5)
    shown = memory.semantic[-5:] + memory.episodic[-5:]
    assert all(f"[{entry.id}] {entry.content}" in view for entry in shown)
    answer = render_answer(memory, memory.semantic, memory.episodic)
    assert memory.core in answer and all(entry.content in answer for entry in everything)


def _assert_printable(text: str, limit: int) -> None:
    assert isinstance(text, str) and text and len(text) <= limit, f"{len(text)} characters: {text[:100]!r}"
    text.encode("utf-8")  # writable to the UTF-8 reports and logs (no lone surrogates)


def assert_well_formed(parsed: ParseResult, results: list[ToolResult]) -> None:
    """Every call has a result with a status; reasons are short text; names are valid text."""
    assert len(results) == len(parsed.calls)
    for result, call in zip(results, parsed.calls):
        assert isinstance(result, ToolResult) and result.status in STATUSES and result.call is call
        _assert_printable(result.reason, REASON_LIMIT)
        assert bool(result.code) == (result.status == "error")
        call.name.encode("utf-8")  # the rollout records the name of every call
    for error in parsed.errors:
        assert isinstance(error, ParseError) and error.code
        _assert_printable(error.reason, REASON_LIMIT)
        assert len(error.raw) <= RAW_LIMIT


def run(memory: Memory, fmt: CallFormat, text: str) -> tuple[ParseResult, list[ToolResult]]:
    """Parse and execute one response through the real path, and check the results' form."""
    outcome = execute_response(memory, text, fmt)
    assert_well_formed(outcome.parsed, outcome.results)
    return outcome.parsed, outcome.results


def run_one(memory: Memory, fmt: CallFormat, text: str) -> ToolResult | ParseError:
    """A response with exactly one call: its result or its parse error."""
    parsed, results = run(memory, fmt, text)
    assert len(parsed.calls) + len(parsed.errors) == 1, (fmt.name, text[:200])
    return results[0] if results else parsed.errors[0]


_ID_AND_CONTENT = attrgetter("id", "content")


def _snapshot(memory: Memory) -> tuple:
    return (memory.core, tuple(map(_ID_AND_CONTENT, memory.semantic)),
            tuple(map(_ID_AND_CONTENT, memory.episodic)))


def assert_failed_without_change(memory: Memory, fmt: CallFormat, text: str, codes: set[str]) -> None:
    """``text`` is one failed call, with a code in ``codes``, that left ``memory`` as it was."""
    before = _snapshot(memory)
    outcome = run_one(memory, fmt, text)
    failed = isinstance(outcome, ParseError) or outcome.status == "error"
    assert failed and outcome.code in codes, (fmt.name, outcome.code)
    assert _snapshot(memory) == before


# ------------------------------------------------------------------------ phases
def phase_path_like(memory: Memory) -> None:
    """Path, URL and code text is data: stored verbatim where it is content, refused elsewhere."""
    for fmt in FORMATS:
        for text in PATH_LIKE:
            for kind in LIST_TYPES:
                content = f"{text} ({fmt.name} {kind})"
                text_call = fmt.render_call(INSERT, {"memory_type": kind, "content": content})
                result = run_one(memory, fmt, text_call)
                assert result.status == "ok" and memory.find(kind, result.memory_id).content == content
            result = run_one(memory, fmt, fmt.render_call(UPDATE, {"memory_type": CORE, "new_content": text}))
            assert memory.core == text and result.status in {"ok", "skipped"}
            unknown_id = {"memory_type": SEMANTIC, "memory_id": text}
            assert_failed_without_change(memory, fmt, fmt.render_call(DELETE, unknown_id), {"unknown_id"})
            assert_failed_without_change(memory, fmt, fmt.render_call(DELETE, {"memory_type": text}),
                                         {"bad_memory_type"})
            extra = {"memory_type": SEMANTIC, "content": "x", text: "y"}
            assert_failed_without_change(memory, fmt, fmt.render_call(INSERT, extra), {"extra_argument"})
            assert_failed_without_change(memory, fmt, fmt.render_call(text, {"memory_type": CORE}),
                                         {"unknown_tool", "bad_name"})


def phase_huge(memory: Memory) -> None:
    """10 MB values, 1 MB keys and names, 100,000 keys: handled, and no reason repeats them."""
    big_word = "z" * 10_000_000
    big_text = "word " * 2_000_000
    for fmt in FORMATS:
        content = f"{fmt.name} {big_word}"
        result = run_one(memory, fmt, fmt.render_call(INSERT, {"memory_type": EPISODIC, "content": content}))
        assert result.status == "ok" and memory.find(EPISODIC, result.memory_id).content == content
        again = run_one(memory, fmt, fmt.render_call(INSERT, {"memory_type": EPISODIC, "content": content}))
        assert again.status == "skipped" and again.memory_id == result.memory_id
        result = run_one(memory, fmt, fmt.render_call(UPDATE, {"memory_type": CORE, "new_content": big_text}))
        assert result.status == "ok" and memory.core.endswith(memory.core_marker)
        huge_key = {"memory_type": SEMANTIC, "content": "x", "k" * 1_000_000: "v"}
        assert_failed_without_change(memory, fmt, fmt.render_call(INSERT, huge_key), {"extra_argument"})
        many_keys = {"memory_type": SEMANTIC, "content": "x", **{f"key{i}": "v" for i in range(100_000)}}
        assert_failed_without_change(memory, fmt, fmt.render_call(INSERT, many_keys), {"extra_argument"})
        huge_name = "n" * 1_000_000
        assert_failed_without_change(memory, fmt, fmt.render_call(huge_name, {"memory_type": CORE}),
                                     {"unknown_tool"})
        cut_off = fmt.render_call(huge_name, {"memory_type": CORE, "new_content": "cut off"})
        broken = [cut_off[: cut_off.index("cut off") + 3]]  # every parse error that quotes the name
        if fmt.name == "qwen":
            broken += [f"✿FUNCTION✿: {huge_name}{tail}" for tail in ("", "\n✿ARGS✿: ", "\n✿ARGS✿: [1]",
                                                                      "\n✿ARGS✿: {}\n✿ARGS✿: {}")]
        else:
            broken += [f'<tool_call>{{"name": "{huge_name}"{tail}}}</tool_call>'
                       for tail in ("", ', "arguments": 1', ', "arguments": "[1]"')]
        for text in broken:
            assert_failed_without_change(memory, fmt, text,
                                         {"truncated", "missing_args", "not_object", "duplicate_args"})
        for key in ("memory_id", "memory_type"):
            arguments = {"memory_type": SEMANTIC, "memory_id": "i"} | {key: "q" * 10_000_000}
            assert_failed_without_change(memory, fmt, fmt.render_call(DELETE, arguments),
                                         {"unknown_id", "bad_memory_type"})
    parsed, _results = run(memory, FORMATS[0], "no call here " * 500_000)
    assert parsed.calls == parsed.errors == []


def _deep_texts(fmt: CallFormat, depth: int) -> list[str]:
    """Responses whose arguments nest ``depth`` levels: as a value, as the object, unclosed."""
    nested_list = "[" * depth + "]" * depth
    nested_object = '{"a": ' * depth + '"x"' + "}" * depth
    arguments = [
        f'{{"memory_type": "semantic_memory", "content": {nested_list}}}',
        f'{{"memory_type": "semantic_memory", "content": {"[" * depth}',  # unclosed: the repair closes it
        nested_object,
    ]
    if fmt.name == "qwen":
        return [f"✿FUNCTION✿: {INSERT}\n✿ARGS✿: {args}" for args in arguments]
    as_string = json.dumps(arguments[0])  # hermes also accepts the arguments as a JSON string
    return [f'<tool_call>{{"name": "{INSERT}", "arguments": {args}}}</tool_call>'
            for args in [*arguments, as_string]] + [f"<tool_call>{nested_object}</tool_call>"]


def phase_deep(memory: Memory) -> None:
    """Nesting past the recursion limit is a failed call with a clear reason, never a RecursionError."""
    for fmt in FORMATS:
        for text in _deep_texts(fmt, 10_000):
            assert_failed_without_change(memory, fmt, text, {"invalid_json"})
            reason = run(memory, fmt, text)[0].errors[0].reason
            assert "nesting too deep" in reason or "unbalanced" in reason, reason
        for text in _deep_texts(fmt, 200):  # shallow enough to decode: refused by the checks that follow
            assert_failed_without_change(memory, fmt, text,
                                         {"wrong_type", "extra_argument", "missing_name", "invalid_json"})


def _call_text(fmt: CallFormat, name: str, arguments: str) -> str:
    """One call written by hand (``render_call`` would re-encode what the test wants verbatim)."""
    if fmt.name == "qwen":
        return f"✿FUNCTION✿: {name}\n✿ARGS✿: {arguments}"
    return f'<tool_call>{{"name": "{name}", "arguments": {arguments}}}</tool_call>'


def _object_text(**values: str) -> str:
    return "{" + ", ".join(f'"{key}": "{value}"' for key, value in values.items()) + "}"


def phase_surrogates(memory: Memory) -> None:
    """Lone surrogates (escaped or raw) are never stored nor echoed; other odd but valid text is kept."""
    for fmt in FORMATS:
        for bad in SURROGATE_TEXTS:
            escaped = json.dumps(bad)[1:-1]  # the six characters \ud800, as a model writes them
            for text in (bad, escaped):
                cases = [
                    (INSERT, _object_text(memory_type=SEMANTIC, content=text), {"invalid_text"}),
                    (UPDATE, _object_text(memory_type=CORE, new_content=text), {"invalid_text"}),
                    (DELETE, _object_text(memory_type=EPISODIC, memory_id=text), {"unknown_id"}),
                    (DELETE, _object_text(memory_type=text), {"bad_memory_type"}),
                    (DELETE, "{" + f'"{text}": "x"' + "}", {"extra_argument"}),
                    (DELETE + text, _object_text(memory_type=CORE), {"bad_name", "unknown_tool"}),
                ]
                responses = [(_call_text(fmt, name, arguments), codes) for name, arguments, codes in cases]
                if fmt.name == "hermes":  # a broken call whose name is not text: the parse error quotes it
                    responses.append((f'<tool_call>{{"name": "{text}"}}</tool_call>', {"bad_name"}))
                for response, codes in responses:
                    assert_failed_without_change(memory, fmt, response, codes)
        for text in VALID_EXOTIC_TEXTS:
            content = f"{fmt.name}: {text}"
            text_call = fmt.render_call(INSERT, {"memory_type": SEMANTIC, "content": content})
            results = run(memory, fmt, text_call)[1]
            if not any(marker in text for marker in ("✿", "<tool_call>", "</tool_call>", "<think>")):
                assert results[0].status == "ok"
                assert memory.find(SEMANTIC, results[0].memory_id).content == content


def phase_wrong_types(memory: Memory) -> None:
    """Each argument of each tool given each other JSON type: ``wrong_type``; a non-object: ``not_object``."""
    good = {INSERT: {"memory_type": SEMANTIC, "content": "typed"},
            UPDATE: {"memory_type": CORE, "new_content": "typed"},
            DELETE: {"memory_type": SEMANTIC, "memory_id": "0000"}}
    for fmt in FORMATS:
        for name in TOOL_NAMES:
            for key in tool_parameters(name)["properties"]:
                for value in WRONG_TYPE_VALUES:
                    text = fmt.render_call(name, {**good[name], key: value})
                    assert_failed_without_change(memory, fmt, text, {"wrong_type"})
        too_many_digits = _call_text(fmt, INSERT, f'{{"memory_type": "{SEMANTIC}", "content": {"9" * 5000}}}')
        assert_failed_without_change(memory, fmt, too_many_digits, {"invalid_json"})
        for value in ("[1, 2]", '"text"', "1", "null", "true", '"[1]"'):
            assert_failed_without_change(memory, fmt, _call_text(fmt, DELETE, value), {"not_object"})
    for payload in ('{"name": 1, "arguments": {}}', '{"name": null}', '{"arguments": {}}', "[]", '"x"'):
        assert_failed_without_change(memory, get_call_format("hermes"), f"<tool_call>{payload}</tool_call>",
                                     {"missing_name", "not_object"})


def phase_unknown_tools(memory: Memory) -> None:
    """Only the three memory tools exist; any other name changes nothing."""
    for fmt in FORMATS:
        for name in UNKNOWN_TOOLS:
            for arguments in ({"memory_type": SEMANTIC, "content": "/etc/passwd"}, {"path": "/dev/zero"}, {}):
                assert_failed_without_change(memory, fmt, fmt.render_call(name, arguments),
                                             {"unknown_tool", "bad_name"})


# ------------------------------------------------------------------------ random calls
def _random_text(rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.55:
        return f"fact {rng.randrange(300)}: " + " ".join(rng.choices(WORDS, k=rng.randrange(1, 8)))
    if roll < 0.65:
        return rng.choice(PATH_LIKE)
    if roll < 0.75:
        return " ".join(rng.choices(WORDS, k=rng.randrange(CORE_LIMIT, 4 * CORE_LIMIT)))  # over the core cap
    if roll < 0.8:
        return rng.choice(["", " ", "\n\t "])
    if roll < 0.85:
        return rng.choice(SURROGATE_TEXTS)
    if roll < 0.9:
        return rng.choice(VALID_EXOTIC_TEXTS)
    return "".join(rng.choices("ab {}[]\"',:\\\n✿<>/é\x00", k=rng.randrange(1, 30)))


def _random_id(rng: random.Random, memory: Memory, kind: str) -> str:
    roll = rng.random()
    entries = memory.entries(kind) if kind in LIST_TYPES else []
    if roll < 0.75 and entries:
        return rng.choice(entries).id
    if roll < 0.85 and memory.semantic + memory.episodic:
        return rng.choice(memory.semantic + memory.episodic).id
    return rng.choice([f"{rng.randrange(16**4):04x}", "", "../../x", "0" * 40])


def _random_call(rng: random.Random, memory: Memory) -> tuple[str, dict]:
    name = rng.choices([INSERT, UPDATE, DELETE, rng.choice(UNKNOWN_TOOLS)], weights=[40, 28, 24, 8])[0]
    parameters = tool_parameters(name) or tool_parameters(DELETE)
    kinds = parameters["properties"]["memory_type"]["enum"]
    kind = rng.choice(kinds) if rng.random() < 0.93 else rng.choice([CORE, "semantic", "", "/etc/passwd"])
    arguments: dict = {}
    for key in parameters["properties"]:
        if rng.random() < (0.04 if key in parameters["required"] or kind in LIST_TYPES else 0.6):
            continue  # a missing argument (memory_id is often left out for the core)
        if rng.random() < 0.04:
            arguments[key] = rng.choice(WRONG_TYPE_VALUES[:-1])
        elif key == "memory_type":
            arguments[key] = kind
        elif key == "memory_id":
            arguments[key] = _random_id(rng, memory, kind)
        else:
            arguments[key] = _random_text(rng)
    if rng.random() < 0.03:
        arguments[rng.choice(["tags", "path", "url", "memory_ids", "Content"])] = _random_text(rng)
    return name, arguments


def _mutate(rng: random.Random, text: str) -> str:
    i = rng.randrange(len(text) + 1)
    roll = rng.random()
    if roll < 0.4:
        return text[:i]  # cut off, as at the response's token limit
    if roll < 0.7:
        return text[:i] + text[rng.randrange(i, len(text) + 1):]
    return text[:i] + "".join(rng.choices("{}[]\"',:\\ \n✿<>/", k=rng.randrange(1, 4))) + text[i:]


def _random_response(rng: random.Random, memory: Memory, fmt: CallFormat) -> tuple[str, int]:
    """One response of 1..4 calls (some corrupted), with optional reasoning and prose; and its call count."""
    pieces = []
    calls = rng.randrange(1, 5)
    for _ in range(calls):
        rendered = fmt.render_call(*_random_call(rng, memory))
        pieces.append(_mutate(rng, rendered) if rng.random() < 0.12 else rendered)
    if rng.random() < 0.1:
        pieces.insert(0, "<think>Store the facts; " + rng.choice(PATH_LIKE) + "</think>")
    return rng.choice(["\n", "\nNext.\n", "\n\n"]).join(pieces), calls


def assert_effect(memory: Memory, call: ToolCall, result: ToolResult, before: tuple,
                  issued: set[str]) -> None:
    """The change ``result`` reports is exactly the change made; anything but ``ok`` changes nothing."""
    after = _snapshot(memory)
    if result.status != "ok":
        assert after == before, (call.name, call.arguments, result)
        return
    kind = call.arguments["memory_type"]
    if kind == CORE:
        assert after[1:] == before[1:]
        if call.name == DELETE:
            assert memory.core == ""
        else:
            new = call.arguments["new_content"]
            assert memory.core == new or (memory.core.endswith(memory.core_marker)
                                          and memory.token_counter(new) > memory.core_token_limit)
        return
    index = 1 if kind == SEMANTIC else 2
    assert after[0] == before[0] and after[3 - index] == before[3 - index]  # the other parts are untouched
    old = before[index]
    if call.name == INSERT:
        assert result.memory_id not in issued, "an id was handed out twice"
        issued.add(result.memory_id)
        expected = (*old, (result.memory_id, call.arguments["content"]))
    elif call.name == UPDATE:
        expected = tuple((i, call.arguments["new_content"] if i == result.memory_id else c) for i, c in old)
    else:
        expected = tuple((i, c) for i, c in old if i != result.memory_id)
    assert after[index] == expected and expected != old


def phase_random(memory: Memory, calls: int = 10_000, seed: int = 16) -> Counter:
    """``calls`` seeded random calls in every format on one memory; returns (tool, status) counts."""
    rng = random.Random(seed)
    issued = {entry.id for entry in memory.semantic + memory.episodic}
    counts: Counter = Counter()
    rendered = 0
    while rendered < calls:
        fmt = rng.choice(FORMATS)
        text, number = _random_response(rng, memory, fmt)
        rendered += number
        parsed = fmt.parse(text)
        results = []
        for call in parsed.calls:
            before = _snapshot(memory)
            result = execute_call(memory, call)
            assert_effect(memory, call, result, before, issued)
            results.append(result)
            counts[call.name if call.name in TOOL_NAMES else "other", result.status] += 1
        counts["parse_error", "error"] += len(parsed.errors)
        assert_well_formed(parsed, results)
        if rendered % 1000 < number:
            assert_store_consistent(memory)
    return counts


# ------------------------------------------------------------------------ tests
PHASES = [phase_path_like, phase_huge, phase_deep, phase_surrogates, phase_wrong_types, phase_unknown_tools]


def fresh_memory() -> Memory:
    memory = Memory(core_token_limit=CORE_LIMIT, seed=16)
    memory.insert(SEMANTIC, "Marta lives in Lisbon.")
    memory.insert(EPISODIC, "On 2024-03-01 the meeting moved to Friday.")
    memory.set_core("The user is Marta.")
    return memory


@pytest.mark.parametrize("phase", PHASES, ids=lambda phase: phase.__name__)
def test_hostile_calls_fail_cleanly_and_keep_the_store_consistent(phase, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    memory = fresh_memory()
    phase(memory)
    assert_store_consistent(memory)
    assert list(tmp_path.iterdir()) == []  # nothing named by the calls was created


def test_ten_thousand_random_calls_on_one_memory():
    memory = fresh_memory()
    counts = phase_random(memory)
    assert_store_consistent(memory)
    # the fuzz reaches every path: each tool succeeds and is refused many times, parse errors occur
    for tool in TOOL_NAMES:
        assert counts[tool, "ok"] > 200 and counts[tool, "error"] > 100, counts
    assert counts[INSERT, "skipped"] > 50 and counts["other", "error"] > 200
    assert counts["parse_error", "error"] > 200
    assert sum(counts.values()) > 9_000


def test_executor_survives_direct_calls_of_any_shape():
    """``execute_call`` is public: a hand-built call with non-text keys or name is refused, not raised."""
    memory = fresh_memory()
    before = _snapshot(memory)
    odd_calls = [
        ToolCall(name=DELETE, arguments={1: "a", "b": "c"}, raw=""),  # keys that do not sort together
        ToolCall(name=DELETE, arguments={(1, 2): "a"}, raw=""),
        ToolCall(name=["memory_delete"], arguments={}, raw=""),  # type: ignore[arg-type]
        ToolCall(name=INSERT, arguments=["semantic_memory", "x"], raw=""),  # type: ignore[arg-type]
        "memory_delete",
        None,
    ]
    for call in odd_calls:
        result = execute_call(memory, call)  # type: ignore[arg-type]
        assert result.status == "error" and result.code and len(result.reason) <= REASON_LIMIT
    assert _snapshot(memory) == before


# ------------------------------------------------------------------------ the sandbox
_ALLOWED_IMPORTS = {"__future__", "abc", "collections.abc", "copy", "dataclasses", "functools", "hashlib",
                    "json", "re", "typing", "memalpha.memory.store",
                    "memalpha.tools.formats", "memalpha.tools.jsonfix", "memalpha.tools.schemas",
                    # the official call-repair policy's parser: only its string entry point is called
                    # (its file readers never are); tests/test_call_repair.py audits that path
                    "json_repair",
                    # the prompt texts: memalpha's file is read once when render/formats are imported,
                    # before any call (the audited run below sees no open or import event)
                    "memalpha.templates.loader"}
# code execution, file and console access, and reflection (a model-written name must never pick an attribute)
_FORBIDDEN_CALLS = {"eval", "exec", "compile", "open", "__import__", "breakpoint", "input", "getattr",
                    "setattr", "globals", "locals", "vars"}


def test_tools_and_memory_import_no_io_and_call_no_eval():
    """The static half of the sandbox: no module of ``memory`` or ``tools`` can reach files or the network."""
    modules = sorted(path for directory in PACKAGE_DIRS for path in directory.glob("*.py"))
    assert len(modules) >= 8
    for path in modules:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                names = {node.module or ""}
            else:
                names = set()
            assert names <= _ALLOWED_IMPORTS, f"{path.name} imports {names - _ALLOWED_IMPORTS}"
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id not in _FORBIDDEN_CALLS, f"{path.name}:{node.lineno} calls {node.func.id}"


def audited_fuzz(random_calls: int) -> None:
    """Run every phase on one memory under an audit hook; print the events seen (the subprocess's job)."""
    events: list[tuple[str, str]] = []
    armed = [False]

    def hook(event: str, args: tuple) -> None:
        if armed[0]:
            events.append((event, repr(args)[:200]))

    memory = fresh_memory()
    sys.addaudithook(hook)
    armed[0] = True
    for phase in PHASES:
        phase(memory)
        assert_store_consistent(memory)
    phase_random(memory, calls=random_calls)
    assert_store_consistent(memory)
    armed[0] = False
    fuzz_events = list(events)
    armed[0] = True  # the hook is live: these must be seen
    with open(os.devnull, encoding="utf-8"):
        pass
    compile("1", "<canary>", "eval")
    armed[0] = False
    canary_events = sorted({name for name, _ in events[len(fuzz_events):]})
    print(json.dumps({"fuzz": fuzz_events, "canary": canary_events}))


def test_executor_path_opens_runs_and_connects_nothing(tmp_path):
    script = f"import sys; sys.path.insert(0, {str(REPO / 'tests')!r}); import test_tool_fuzz; " \
             "test_tool_fuzz.audited_fuzz(random_calls=3_000)"
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["canary"] == ["compile", "open"]
    assert report["fuzz"] == []  # no open, socket, exec/compile, subprocess, os.* or import event at all
    assert list(tmp_path.iterdir()) == []
