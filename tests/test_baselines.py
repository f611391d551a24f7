"""The memories that learn nothing (memalpha/agent/baselines.py): raw chunks with BM25 top k and the
full text cut to the reader's budget, by hand on small memories, then through ``memalpha validate``,
``predict``, ``compare`` and the Python API on a tiny random model, and the settings refused with them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from test_training import write_config

from memalpha.agent.baselines import (
    BASELINE_KIND_KEY,
    BASELINE_TOP_K_KEY,
    BaselineSettings,
    cut_full_text,
    memory_label,
    stored_memory,
)
from memalpha.cli import main, run
from memalpha.commands.compare import format_result
from memalpha.inference.memory_agent import MemoryAgent
from memalpha.memory.store import Memory
from memalpha.reader.extractive import ExtractiveReader
from memalpha.reader.options import RetrievalSettings
from memalpha.train.settings_loader import AgentLoadError

CHUNKS = [
    "Ada moved to Lisbon in March and bakes bread.",
    "Bob plays chess in Oslo on Fridays.",
    "Cleo keeps bees near Porto.",
    "Bob plays chess in Oslo on Fridays.",
]


def test_raw_chunks_stores_each_chunk_once_in_order_and_full_text_one_entry():
    raw = stored_memory("raw_chunks", CHUNKS, Memory())
    assert [e.content for e in raw.episodic] == CHUNKS[:3] and raw.semantic == [] and raw.core == ""
    full = stored_memory("full_text", CHUNKS, Memory())
    assert [e.content for e in full.episodic] == ["\n\n".join(CHUNKS)]
    empty = stored_memory("empty", CHUNKS, Memory())
    assert empty.episodic == empty.semantic == [] and empty.core == "" and empty.total_tokens() == 0
    with pytest.raises(ValueError, match="baseline kind must be one of"):
        stored_memory("summaries", CHUNKS, Memory())


def test_the_reader_answers_a_raw_chunks_memory_from_its_top_k():
    reader = ExtractiveReader()  # its answer is the retrieved text, so it shows what was retrieved
    memory = stored_memory("raw_chunks", CHUNKS, Memory())
    (top2,) = reader.answer([(memory, "Where does Bob play chess?")], top_k=2)
    assert top2.text.splitlines()[0] == CHUNKS[1] and len(top2.text.splitlines()) == 2
    (top1,) = reader.answer([(memory, "Who keeps bees?")], top_k=1)
    assert top1.text == CHUNKS[2]
    (own,) = reader.answer([(memory, "Who keeps bees?")])  # the reader's own top 20: every chunk
    assert len(own.text.splitlines()) == 3


def test_full_text_keeps_the_longest_end_that_fits_the_readers_prompt(tokenizer):
    text = " ".join(f"Fact {n}: item {n} is blue." for n in range(60))
    reader = ExtractiveReader(retrieval=RetrievalSettings(prompt_tokens=300))  # counts words
    memory = stored_memory("full_text", [text], Memory())
    questions = ["What colour is item 59?", "What colour is item 3 of them all?"]
    cut = cut_full_text(memory, questions, "synth", reader, tokenizer)
    (kept,) = cut.episodic
    assert text.endswith(kept.content) and len(kept.content) < len(text)

    def size(content: str) -> int:
        return max(reader.prompt_size(cut, [], [type(kept)("x", content)], q, None) for q in questions)

    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    kept_tokens = len(tokenizer(kept.content, add_special_tokens=False)["input_ids"])
    assert size(kept.content) <= 300 < size(tokenizer.decode(ids[-(kept_tokens + 1):]))
    assert cut_full_text(memory, ["q?"], "synth", ExtractiveReader(), tokenizer) is memory  # fits whole
    tight = ExtractiveReader(retrieval=RetrievalSettings(prompt_tokens=3))
    with pytest.raises(ValueError, match="over its 3-token limit with no text at all"):
        cut_full_text(memory, questions, "synth", tight, tokenizer)


@pytest.mark.parametrize(
    ("settings", "label", "top_k"),
    [(BaselineSettings(), "agent", None), (BaselineSettings("raw_chunks", 3), "raw_chunks top 3", 3),
     (BaselineSettings("full_text"), "full_text", 1), (BaselineSettings("empty"), "empty", None)],
)
def test_settings_name_what_wrote_the_memory(settings, label, top_k):
    recorded = settings.record()
    assert settings.label == label == memory_label(recorded[BASELINE_KIND_KEY], recorded[BASELINE_TOP_K_KEY])
    assert settings.answer_top_k == top_k


@pytest.mark.parametrize(
    ("values", "message"),
    [({"kind": "summaries"}, "rollout.baseline.kind must be null or one of"),
     ({"top_k": 0}, "rollout.baseline.top_k must be >= 1")],
)
def test_bad_settings_are_one_line(values, message):
    with pytest.raises(ValueError, match=message):
        BaselineSettings(**values)


# ------------------------------------------------------------------ through the commands
@pytest.fixture(scope="module")
def config(tmp_path_factory, tiny_model_dir) -> Path:
    path = write_config(tmp_path_factory.mktemp("baselines"), tiny_model_dir)
    settings = yaml.safe_load(path.read_text())
    settings["trainer"]["enable_progress_bar"] = False
    path.write_text(yaml.safe_dump(settings))
    return path


def validate(config: Path, version: str, *args: str) -> dict:
    main(["validate", "--config", str(config), "--trainer.logger.init_args.version", version, *args])
    save_dir = yaml.safe_load(config.read_text())["trainer"]["logger"]["init_args"]["save_dir"]
    return json.loads((Path(save_dir) / "tb" / version / "validation.json").read_text())


@pytest.fixture(scope="module")
def reports(config) -> dict[str, dict]:
    return {
        "agent": validate(config, "agent"),
        "raw": validate(config, "raw", "--model.rollout.baseline.kind", "raw_chunks"),
        "full": validate(config, "full", "--model.rollout.baseline.kind", "full_text"),
        "empty": validate(config, "empty", "--model.rollout.baseline.kind", "empty"),
    }


def test_validate_scores_a_baseline_with_the_agents_reader_and_records_it(reports):
    agent, raw, full = reports["agent"], reports["raw"], reports["full"]
    assert agent["summary"]["settings"]["scoring"] == raw["summary"]["settings"]["scoring"]
    memory = {name: report["summary"]["settings"]["memory"] for name, report in reports.items()}
    assert memory["raw"] == {BASELINE_KIND_KEY: "raw_chunks", BASELINE_TOP_K_KEY: 2}
    assert memory["agent"] == {BASELINE_KIND_KEY: None, BASELINE_TOP_K_KEY: None}
    for report in (raw, full):
        overall = report["summary"]["overall"]
        assert (overall["tool_success"], overall["mean_reward"], overall["tool_calls"]) == (None, None, 0)
        assert overall["fact_recall"] == 1.0  # the text holds every fact
        for record in report["records"]:
            assert record["turns"] == [] and len(record["questions"]) == 2
    for record in raw["records"]:  # every chunk stored as it came: the memory is the input
        assert len(record["memory"]["episodic"]) == 2 and record["memory_tokens"] == record["chunk_tokens"]
    stored = {r["instance_id"]: [e["content"] for e in r["memory"]["episodic"]] for r in raw["records"]}
    for record in full["records"]:  # the chunks in one entry (short enough to fit whole)
        whole = "\n\n".join(stored[record["instance_id"]])
        assert [e["content"] for e in record["memory"]["episodic"]] == [whole]
    empty = reports["empty"]  # the floor: the reader's priors from a memory that holds nothing
    assert empty["summary"]["settings"]["memory"] == {BASELINE_KIND_KEY: "empty", BASELINE_TOP_K_KEY: 2}
    overall = empty["summary"]["overall"]
    assert overall["fact_recall"] == 0.0 and overall["tool_calls"] == 0
    for record in empty["records"]:
        assert record["turns"] == [] and record["memory_tokens"] == 0 and record["memory"]["episodic"] == []
        assert len(record["questions"]) == 2


def test_compare_sets_an_agent_against_a_baseline_with_memory_size_beside_accuracy(
    reports, tmp_path, capsys
):
    paths = []
    for name in ("agent", "raw"):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(reports[name]))
    run(["compare", *map(str, paths), "--labels", "agent,raw", "--out", str(tmp_path / "c.json")])
    printed = capsys.readouterr().out
    result = json.loads((tmp_path / "c.json").read_text())
    assert [r["memory"] for r in result["reports"]] == ["agent", "raw_chunks top 2"]
    (overall, *_) = result["changes"][0]["rows"]
    assert overall["tool_success"] is None and overall["mean_reward"] is None
    assert overall["accuracy"] is not None and overall["memory_tokens"]["mean"] > 0
    assert "raw_chunks top 2 learns nothing, makes no tool call" in printed
    header = format_result(result).splitlines()[3]
    assert header.split()[:6] == ["report", "memory", "instances", "questions", "accuracy", "memory_tokens"]


def test_predict_stores_the_chunks_without_a_turn(config, tmp_path):
    texts = tmp_path / "notes"
    texts.mkdir()
    (texts / "a.txt").write_text("Ada lives in Lisbon.\n\nShe adopted a cat named Pixel.\n", encoding="utf-8")
    output = tmp_path / "out.jsonl"
    main(["predict", "--config", str(config), "--data.predict.path", str(texts), "--data.predict.output",
          str(output), "--data.predict.split", "blank_lines", "--model.rollout.baseline.kind", "raw_chunks"])
    (record,) = [json.loads(line) for line in output.read_text().splitlines()]
    assert record["chunks"] == 2 and record["turns"] == []
    assert [e["content"] for e in record["memory"]["episodic"]] == [
        "Ada lives in Lisbon.", "She adopted a cat named Pixel."
    ]


def adapter_of(fit_run: dict) -> Path:
    """The adapter folder the one-step fit exported."""
    (adapter,) = (fit_run["root"] / "run" / "tb").glob("*/adapter")
    return adapter


@pytest.mark.parametrize(
    ("command", "args", "message"),
    [
        ("fit", ["--model.rollout.baseline.kind", "raw_chunks"],
         ("memalpha fit: error: model.rollout.baseline.kind raw_chunks learns nothing, "
          "so there is nothing to fit")),
        ("validate", ["--model.rollout.baseline.kind", "full_text", "--model.adapter_path", "ADAPTER"],
         ("memalpha validate: error: model.rollout.baseline.kind full_text learns nothing and loads no "
          "adapter: leave model.adapter_path out")),
        ("validate", ["--model.rollout.baseline.kind", "raw_chunks", "--ckpt_path", "CKPT"],
         ("memalpha validate: error: model.rollout.baseline.kind raw_chunks loads no adapter: leave "
          "--ckpt_path out")),
    ],
)
def test_a_setting_that_means_nothing_for_a_baseline_is_one_line(
    config, tiny_fit_run, command, args, message, capsys
):
    args = [a.replace("ADAPTER", str(adapter_of(tiny_fit_run))).replace("CKPT", str(tiny_fit_run["ckpt"]))
            for a in args]
    with pytest.raises(SystemExit) as stopped:
        main([command, "--config", str(config), *args])
    assert message in f"{stopped.value.code}{capsys.readouterr().err}"


def test_the_api_reads_and_answers_as_the_baseline_scores(config, tiny_model_dir):
    agent = MemoryAgent.baseline("raw_chunks", config=config, top_k=1, reader={"kind": "extractive"})
    assert agent.policy is None  # the extractive reader needs no weights
    reading = agent.memorise("Ada lives in Lisbon.\n\nBob plays chess.", split="blank_lines")
    assert [e.content for e in reading.memory.episodic] == ["Ada lives in Lisbon.", "Bob plays chess."]
    assert reading.chunks == 2 and reading.turns == []
    (answer,) = agent.answer(["What does Bob play?"], reading.memory, golds=["chess"])
    assert answer["prediction"] == "Bob plays chess." and answer["score"] == 1.0
    local = MemoryAgent.baseline("full_text", config=config)
    assert local.policy is not None and not hasattr(local.policy, "peft_config")  # the bare base, no adapter
    (answer,) = local.answer(["What does Bob play?"], local.memorise("Bob plays chess.").memory)
    assert answer["error"] is None


def test_the_api_refuses_a_baseline_with_an_adapter_in_one_line(config, tiny_fit_run):
    raw = {"baseline": {"kind": "raw_chunks"}}
    with pytest.raises(AgentLoadError, match="loads no adapter: use MemoryAgent.baseline"):
        MemoryAgent.load(adapter_of(tiny_fit_run), config=config, rollout=raw)
    with pytest.raises(AgentLoadError, match="baseline kind must be one of"):
        MemoryAgent.baseline("summaries", config=config)


def test_the_committed_demo_comparison_sets_the_agents_between_the_baselines():
    committed = Path(__file__).resolve().parents[1] / "experiments" / "results" / "baselines_demo.json"
    result = json.loads(committed.read_text(encoding="utf-8"))
    memories = {r["label"]: (r["memory"], r["accuracy"], r["memory_tokens"]) for r in result["reports"]}
    assert memories["raw_chunks"][0] == "raw_chunks top 2" and memories["full_text"][0] == "full_text"
    assert memories["sft"][0] == memories["grpo"][0] == "agent"
    # the README's sentence: the SFT agent's memory is a quarter of raw chunks' and answers less
    assert memories["sft"][1] == 0.28125 and round(memories["sft"][2], 1) == 64.2
    assert memories["raw_chunks"][1] == 0.375 and round(memories["raw_chunks"][2], 1) == 247.2
    assert "raw_chunks top 2 stores the text" in format_result(result)
