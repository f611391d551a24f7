"""Prompt templates (memalpha.templates): memalpha's file renders every prompt byte for byte as
the code did before the texts moved into it, the loader refuses a wrong file with one line
naming the file and the key, and ``rollout.prompt_templates`` reaches every prompt.

``fixtures/prompt_texts_memalpha.json`` was written by the code *before* the texts moved to
``memalpha/templates/memalpha.yaml`` (the constants of agent/memorise_prompts.py, reader/answer_prompts.py and
the memory views, the tool blocks of tools/formats.py), from the inputs :func:`render_all` uses.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from memalpha.agent.answer_metrics import score_answer
from memalpha.agent.content_judges import LLMContentJudge
from memalpha.agent.memorise_prompts import (
    answer_judge_prompt,
    content_judge_messages,
    memorise_messages,
    render_memorise,
    stated_response_limit,
)
from memalpha.agent.rollout import turn_prompt
from memalpha.agent.rollout_settings import RolloutSettings
from memalpha.memory.store import Memory
from memalpha.reader.answer_prompts import answer_messages, render_answer
from memalpha.reader.base import Reader, ReaderAnswer
from memalpha.templates.loader import (
    OPTIONAL_TEMPLATES,
    PLACEHOLDERS,
    TEMPLATE_NAMES,
    default_templates,
    dump_templates,
    load_templates,
)
from memalpha.tools.formats import ToolCall, get_call_format

EXPECTED = json.loads(
    (Path(__file__).parent / "fixtures" / "prompt_texts_memalpha.json").read_text(encoding="utf-8")
)


def _memory() -> Memory:
    memory = Memory(seed=7)
    memory.core = "User studies medicine."
    for i in range(3):
        memory.insert("semantic_memory", f"fact {i}")
    memory.insert("episodic_memory", "At 2024-01-01, user read a paper.")
    return memory


def content_judge_prompt(kind: str, content: str, templates=None) -> str:
    """The content judge's messages for one write as one text (the fixture's form)."""
    return "\n\n".join(m["content"] for m in content_judge_messages(kind, content, templates))


def render_all(templates=None) -> dict:
    """Every prompt for fixed inputs (the same calls that wrote the fixture, plus ``templates``)."""
    t = {"templates": templates}
    out = {}
    full, empty = _memory(), Memory()
    out["view_full_k2"] = render_memorise(full, 2, **t)
    out["view_full_k0"] = render_memorise(full, 0, **t)
    out["view_empty"] = render_memorise(empty, 5, **t)
    out["answer_view_full"] = render_answer(full, full.semantic[1:], full.episodic, **t)
    out["answer_view_none"] = render_answer(full, [], [], **t)
    out["answer_view_empty"] = render_answer(empty, [], [], **t)
    for fmt in ("qwen", "hermes"):
        for profile in ("full", "compact"):
            for limit in (None, 300):
                out[f"memorise_{fmt}_{profile}_{limit}"] = memorise_messages(
                    render_memorise(full, 2, **t),
                    "The chunk {with} braces.",
                    get_call_format(fmt),
                    limit,
                    profile,
                    **t,
                )
    out["answer_messages_bare"] = answer_messages(
        render_answer(full, full.semantic, [], **t), "Who? {x}", **t
    )
    out["answer_messages_instr"] = answer_messages(
        render_answer(empty, [], [], **t), "Label?", "Put it in \\boxed{}.", has_core=False, **t
    )
    out["answer_judge"] = answer_judge_prompt("Q {a}?", "rubric", "resp", **t)
    for kind in ("core", "semantic", "episodic"):
        out[f"content_judge_{kind}"] = content_judge_prompt(kind, "At noon {x} happened.", **t)
    return out


def test_default_file_renders_every_prompt_as_before():
    got = render_all()
    assert set(got) == set(EXPECTED) and len(EXPECTED) == 20
    for key, text in EXPECTED.items():
        assert got[key] == text, key
    assert render_all(load_templates(None)) == got  # None and the explicit default agree


def test_fixture_is_not_vacuous():
    # the fixture holds the real texts: spot-check pieces of each kind of prompt
    assert "(showing the most recent 2 of 3 entries)" in EXPECTED["view_full_k2"]
    assert "(entries not shown: prompt budget)" in EXPECTED["view_full_k0"]
    assert EXPECTED["memorise_qwen_full_300"][0]["content"].count("✿FUNCTION✿") >= 2
    assert EXPECTED["memorise_qwen_full_300"][1]["content"].endswith("keep every call short.")
    assert "<tools>" in EXPECTED["memorise_hermes_full_None"][0]["content"]
    assert EXPECTED["answer_messages_instr"][1]["content"] == "Put it in \\boxed{}.\n\nLabel?"
    assert '{"VALID": true or false' in EXPECTED["content_judge_core"]


def _own_texts() -> dict[str, str]:
    """A complete template set with made-up texts that name every placeholder (no optional template)."""
    return {
        name: f"<{name}>" + "".join(f"[{p}={{{p}}}]" for p in sorted(PLACEHOLDERS[name]))
        for name in TEMPLATE_NAMES if name not in OPTIONAL_TEMPLATES
    }


def test_a_replacement_file_changes_every_prompt(tmp_path):
    path = tmp_path / "own.yaml"
    path.write_text(dump_templates(_own_texts()), encoding="utf-8")
    own = load_templates(path)
    assert own.source == str(path)
    got = render_all(own)
    assert got["view_full_k2"].startswith("<core_memory>\nUser studies medicine.\n</core_memory>")
    assert "<semantic_memory> <view_recent_header>[shown=2][total=3]\n" in got["view_full_k2"]
    assert "<view_hidden_list>" in got["view_full_k0"] and "<view_empty_core>" in got["view_empty"]
    assert "<answer_view_empty_list>" in got["answer_view_none"]
    system, user = (m["content"] for m in got["memorise_qwen_full_300"])
    assert system.startswith("<memorise_system>[memory_view=<core_memory>")
    assert (
        "[tool_block=<tool_block_qwen>[tool_names=new_memory_insert, memory_update, memory_delete][tools={"
        in system
    )
    assert (
        user == "<memorise_user>[chunk=The chunk {with} braces.][limit_note=<response_limit_note>[limit=300]]"
    )
    assert got["memorise_hermes_compact_None"][0]["content"].count("<tool_block_hermes_compact>") == 1
    assert got["memorise_hermes_full_None"][0]["content"].count("<tool_block_hermes>") == 1
    assert got["memorise_qwen_compact_None"][1]["content"].startswith("<compact_user>")
    assert got["answer_messages_bare"][0]["content"].startswith("<answer_system>[memory=")
    assert got["answer_messages_instr"][0]["content"].startswith("<answer_system_no_core>[memory=")
    assert (
        got["answer_messages_instr"][1]["content"]
        == "<answer_user>[instruction=Put it in \\boxed{}.][question=Label?]"
    )
    assert got["answer_judge"] == "<answer_judge>[question=Q {a}?][response=resp][rubric=rubric]"
    assert got["content_judge_episodic"] == (
        "<content_judge>[content=At noon {x} happened.][kind=episodic][rules=<content_judge_episodic>]"
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda t: t.update(extra="x"), "own.yaml: unknown template key(s) ['extra']"),
        (lambda t: t.pop("answer_user"), "own.yaml: missing template key(s) ['answer_user']"),
        (
            lambda t: t.update(answer_user="{question}"),
            (
                "own.yaml: answer_user must have exactly the placeholders "
                "['instruction', 'question'], got ['question']"
            ),
        ),
        (
            lambda t: t.update(view_empty_list="{x}"),
            "own.yaml: view_empty_list must have exactly the placeholders [], got ['x']",
        ),
        (
            lambda t: t.update(answer_judge="{} {} {}"),
            "own.yaml: answer_judge is not a valid template (has a positional",
        ),
        (
            lambda t: t.update(content_judge="{kind} {rules} {content"),
            "own.yaml: content_judge is not a valid template",
        ),
        (lambda t: t.update(memorise_user=3), "own.yaml: memorise_user must be a text, got int"),
        # the rules moved: not in the user message
        (
            lambda t: t.update(content_judge_system="[rules={rules}]"),
            (
                "own.yaml: content_judge must have exactly the placeholders "
                "['content', 'kind'], got ['content', 'kind', 'rules']"
            ),
        ),
        (
            lambda t: t.update(content_judge_system="{kind}", content_judge="{kind} {content}"),
            "own.yaml: content_judge_system must have exactly the placeholders ['rules'], got ['kind']",
        ),
        # all of its placeholders, or none (a fixed block)
        (
            lambda t: t.update(tool_block_qwen="{tools} only"),
            (
                "own.yaml: tool_block_qwen must have exactly the placeholders "
                "['tool_names', 'tools'], got ['tools']"
            ),
        ),
        (
            lambda t: t.update(tool_block_hermes="fixed"),
            "own.yaml: tool_block_hermes must have exactly the placeholders ['tools'], got []",
        ),
    ],
)
def test_loader_refuses_a_wrong_file_in_one_line(tmp_path, change, message):
    texts = _own_texts()
    change(texts)
    path = tmp_path / "own.yaml"
    path.write_text(yaml.safe_dump(texts, allow_unicode=True), encoding="utf-8")
    with pytest.raises(ValueError) as info:
        load_templates(path)
    assert str(path) in str(info.value) and message.split(": ", 1)[1] in str(info.value)
    assert "\n" not in str(info.value)


def test_loader_refuses_a_missing_or_unreadable_file(tmp_path):
    with pytest.raises(ValueError, match="nope.yaml: prompt-template file not found"):
        load_templates(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [1\n", encoding="utf-8")
    with pytest.raises(ValueError, match="bad.yaml: not a readable YAML file"):
        load_templates(bad)
    bad.write_text("- a\n", encoding="utf-8")
    with pytest.raises(ValueError, match="bad.yaml: a prompt-template file must be a mapping"):
        load_templates(bad)


def test_rollout_setting_validates_and_reaches_the_turn_prompt(tmp_path):
    with pytest.raises(
        ValueError, match=r"^rollout.prompt_templates: .*missing.yaml: prompt-template file not found"
    ):
        RolloutSettings(prompt_templates=str(tmp_path / "missing.yaml"))
    assert RolloutSettings().templates is default_templates()
    path = tmp_path / "own.yaml"
    path.write_text(dump_templates(_own_texts()), encoding="utf-8")
    settings = RolloutSettings(prompt_templates=str(path), max_prompt_tokens=10_000)

    class Tokenizer:  # chat_prompt_ids only needs a chat template that returns ids
        def apply_chat_template(self, messages, **kwargs):
            return list(range(len(messages)))

    messages, _ = turn_prompt(Tokenizer(), _memory(), "chunk", get_call_format("qwen"), settings, where="t")
    assert messages[0]["content"].startswith("<memorise_system>[memory_view=<core_memory>")
    assert "<view_recent_header>[shown=3][total=3]" in messages[0]["content"]
    default_messages, _ = turn_prompt(Tokenizer(), _memory(), "chunk", get_call_format("qwen"),
                                      replace(settings, prompt_templates=None), where="t")
    assert default_messages == memorise_messages(
        render_memorise(_memory(), 5), "chunk", get_call_format("qwen"), 2048
    )


class _EchoReader(Reader):
    """Replies with the prompt it got, so a test sees what the reader sent."""

    def chat(self, conversations):
        return [ReaderAnswer(text=json.dumps(c), ok=True) for c in conversations]

    def count_tokens(self, text):
        return len(text.split())


def test_reader_and_judges_use_the_readers_templates(tmp_path):
    path = tmp_path / "own.yaml"
    path.write_text(dump_templates(_own_texts()), encoding="utf-8")
    reader = _EchoReader(templates=load_templates(path))
    memory = _memory()
    [conversation] = reader.answer_conversations([(memory, "what?")])
    assert conversation[0]["content"].startswith("<answer_system>[memory=<core_memory>")
    [conversation] = reader.answer_conversations([(Memory(), "what?")])
    assert conversation[0]["content"].startswith(
        "<answer_system_no_core>[memory=<semantic_memory>\n<answer_view_empty_list>"
    )
    sent = []
    reader.complete = lambda prompts: sent.extend(prompts) or [ReaderAnswer("yes", True) for _ in prompts]
    assert score_answer("lme_train", "resp", "gold", "q", judge=reader) == 1.0
    assert sent[-1] == "<answer_judge>[question=q][response=resp][rubric=gold]"
    LLMContentJudge(reader).judge(
        [ToolCall("new_memory_insert", {"memory_type": "semantic_memory", "content": "c"}, "")]
    )
    assert sent[-1] == "<content_judge>[content=c][kind=semantic][rules=<content_judge_semantic>]"
    assert _EchoReader().templates is default_templates()


class _RecordingReader(Reader):
    """Records every conversation it is sent and replies with a valid judgement."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.sent = []

    def chat(self, conversations):
        self.sent.extend(conversations)
        return [
            ReaderAnswer('```json\n{"VALID": true, "ISSUES": [], "EXPLANATION": "ok"}\n```', True)
            for _ in conversations
        ]

    def count_tokens(self, text):
        return len(text.split())


def test_content_judge_sends_one_message_or_the_split_the_templates_define(tmp_path):
    calls = [
        ToolCall(
            "new_memory_insert", {"memory_type": "episodic_memory", "content": "At noon {x} happened."}, ""
        ),
        ToolCall("memory_delete", {"memory_type": "semantic_memory", "memory_id": "1"}, ""),
        ToolCall("memory_update", {"memory_type": "core_memory", "new_content": "User reads."}, ""),
    ]
    # memalpha's texts: one user message per judged write, the prompt of before
    reader = _RecordingReader()
    assert LLMContentJudge(reader).judge(calls) == [1.0, 0.0, 1.0]
    assert reader.sent == [[{"role": "user", "content": EXPECTED["content_judge_episodic"]}],
                           [{"role": "user", "content": content_judge_prompt("core", "User reads.")}]]
    assert content_judge_messages("core", "c") == [
        {"role": "user", "content": content_judge_prompt("core", "c")}
    ]
    # a file with content_judge_system: the rules as the system message, the entry as the user message
    texts = _own_texts() | {
        "content_judge_system": "<system>[rules={rules}]",
        "content_judge": "<user>[kind={kind}][content={content}]",
    }
    path = tmp_path / "split.yaml"
    path.write_text(dump_templates(texts), encoding="utf-8")
    split = load_templates(path)
    assert split.content_judge_system == "<system>[rules={rules}]"
    assert "content_judge_system: <system>[rules={rules}]" in path.read_text(encoding="utf-8")
    reader = _RecordingReader(templates=split)
    assert LLMContentJudge(reader).judge(calls) == [1.0, 0.0, 1.0]
    assert reader.sent == [
        [{"role": "system", "content": "<system>[rules=<content_judge_episodic>]"},
         {"role": "user", "content": "<user>[kind=episodic][content=At noon {x} happened.]"}],
        [{"role": "system", "content": "<system>[rules=<content_judge_core>]"},
         {"role": "user", "content": "<user>[kind=core][content=User reads.]"}],
    ]
    # without the key (or with it null) the file keeps the one-message judge
    assert load_templates(_write(tmp_path / "own.yaml", _own_texts())).content_judge_system is None
    assert (
        load_templates(
            _write(tmp_path / "null.yaml", _own_texts() | {"content_judge_system": None})
        ).content_judge_system
        is None
    )
    assert default_templates().content_judge_system is None


def test_the_retry_text_is_optional_fixed_and_reaches_the_judge_only_when_asked_again(tmp_path):
    assert default_templates().content_judge_retry is None
    assert load_templates(_write(tmp_path / "own.yaml", _own_texts())).content_judge_retry is None
    texts = _own_texts() | {"content_judge_retry": "\n\nMADE-UP RETRY {{literal}}."}
    path = tmp_path / "retry.yaml"
    # a text starting with an empty line survives the dump
    path.write_text(dump_templates(texts), encoding="utf-8")
    retrying = load_templates(path)
    assert retrying.render("content_judge_retry") == "\n\nMADE-UP RETRY {literal}."
    with pytest.raises(
        ValueError, match=r"content_judge_retry must have exactly the placeholders \[\], got \['kind'\]"
    ):
        load_templates(_write(tmp_path / "bad.yaml", _own_texts() | {"content_judge_retry": "again {kind}"}))
    call = ToolCall("new_memory_insert", {"memory_type": "semantic_memory", "content": "c"}, "")
    reader = _RecordingReader(templates=retrying)
    # well-formed at once: one ask, no retry text
    assert LLMContentJudge(reader, attempts=3).judge([call]) == [1.0]
    assert reader.sent == [
        [
            {
                "role": "user",
                "content": "<content_judge>[content=c][kind=semantic][rules=<content_judge_semantic>]",
            }
        ]
    ]


def _write(path, texts):
    path.write_text(yaml.safe_dump(texts, allow_unicode=True), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("cap", "share", "stated"),
    [(2048, 0.8, 1638), (2048, 1.0, 2048), (64, 0.8, 51), (1000, 0.7, 700), (2048, 0.3, 614),
     # 100 * 0.29 is 28.999... in floating point: int() truncates it, as the official code does
     (100, 0.29, 28),
     (1, 0.5, 1)],  # never below one token
)
def test_stated_response_limit_truncates_share_times_cap(cap, share, stated):
    assert stated_response_limit(cap, share) == stated


def test_stated_limit_share_is_validated_and_states_the_same_number_everywhere(tokenizer):
    for bad in (0.0, -0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match=r"^rollout.stated_limit_share must be in \(0, 1\], got"):
            RolloutSettings(stated_limit_share=bad)
    with pytest.raises(ValueError):
        stated_response_limit(2048, 0.0)
    settings = RolloutSettings(max_new_tokens=256, stated_limit_share=0.8, max_prompt_tokens=4096)
    messages, _ = turn_prompt(tokenizer, _memory(), "chunk", get_call_format("qwen"), settings, where="t")
    assert messages[1]["content"].endswith("\n\nYour reply may be at most 204 tokens: keep every call short.")
    default, _ = turn_prompt(
        tokenizer,
        _memory(),
        "chunk",
        get_call_format("qwen"),
        replace(settings, stated_limit_share=1.0),
        where="t",
    )
    assert default[1]["content"].endswith("at most 256 tokens: keep every call short.")
    # the oracle demonstrations (SFT) take their prompts from the same turn_prompt
    from memalpha.agent.oracle_demos import oracle_demonstrations
    from memalpha.data.synthetic import generate_synthetic

    instances = generate_synthetic(
        1,
        split="train",
        seed=1,
        num_chunks=2,
        facts_per_chunk=1,
        distractors_per_chunk=0,
        questions_per_instance=1,
        chunk_words=30,
        families=("synth_personal",),
    )
    demos = oracle_demonstrations(instances, tokenizer, settings, seed=1)
    assert demos and all(
        d.messages[1]["content"].endswith("at most 204 tokens: keep every call short.") for d in demos
    )
