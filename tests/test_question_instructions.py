"""The per-source question instructions: the shipped table, its replacement by a file, the
one-line errors of a bad file, and the instruction reaching the reader model's prompt."""

from __future__ import annotations

import json
from fnmatch import fnmatch
from pathlib import Path

import pytest

from memalpha.agent.answer_metrics import metric_for_source
from memalpha.agent.rollout import answer_questions, start_rollouts
from memalpha.agent.rollout_settings import RolloutSettings
from memalpha.cli import main
from memalpha.data.loaders import load_instances
from memalpha.data.schema import QA, Instance
from memalpha.memory.store import EPISODIC, SEMANTIC, Memory
from memalpha.reader.answer_prompts import answer_messages
from memalpha.reader.local import LocalReader
from memalpha.reader.options import RetrievalSettings
from memalpha.reader.question_instructions import BUILTIN, BUILTIN_FILE, load_question_instructions
from memalpha.reader.settings import ReaderSettings

REPO = Path(__file__).resolve().parents[1]
PUBMED_PARQUET = REPO / "tests" / "fixtures" / "data" / "memalpha_pubmed.parquet"

# the data_source names of the official Mem-α training set and of MemoryAgentBench
CLASSIFICATION = [
    "pubmed-rct", "ttl_train", "icl_banking77_5900shot_balance", "icl_clinic150_7050shot_balance",
    "icl_nlu_8296shot_balance", "icl_trec_coarse_6600shot_balance", "icl_trec_fine_6400shot_balance",
]
SUMMARY = ["booksum", "infbench_sum_eng_shots2"]
BARE = ["squad", "hotpotqa", "perltqa", "lme_train", "ruler_qa1_197K", "ruler_qa2_421K", "longmemeval_s*",
        "synth_icl", "synth_personal", "unlisted_source"]
BOXED = "\\boxed{label}"


@pytest.fixture(scope="module")
def builtin():
    return load_question_instructions(BUILTIN)


@pytest.mark.parametrize("source", CLASSIFICATION)
def test_every_boxed_label_source_is_told_to_box_one_number(builtin, source):
    instruction = builtin.for_source(source)
    assert metric_for_source(source) == "boxed"  # the instruction serves the metric that scores the source
    assert BOXED in instruction and "single number" in instruction
    assert instruction.index("core memory") < instruction.index(BOXED)
    # as in the official table: labelled examples are mentioned except for PubMed-RCT and TREC
    assert ("labelled examples" in instruction) == (
        source.startswith(("ttl_", "icl_")) and "trec" not in source
    )


@pytest.mark.parametrize("source", SUMMARY)
def test_book_summary_sources_are_pointed_at_the_core_summary(builtin, source):
    instruction = builtin.for_source(source)
    assert "core memory holds a summary of the book" in instruction and BOXED not in instruction


@pytest.mark.parametrize("source", BARE)
def test_other_sources_get_the_bare_question(builtin, source):
    assert builtin.for_source(source) is None


def test_the_loaders_source_names_find_their_instructions(builtin, tmp_path, tokenizer):
    (pubmed,), _ = load_instances(PUBMED_PARQUET, limit=1)  # the official parquet layout
    assert pubmed.data_source == "pubmed-rct" and BOXED in builtin.for_source(pubmed.data_source)
    path = tmp_path / "mab.jsonl"  # the MemoryAgentBench layout: data_source is metadata.source
    sources = ["icl_banking77_5900shot_balance", "infbench_sum_eng_shots2", "ruler_qa1_197K"]
    path.write_text(
        "".join(
            json.dumps({"context": "Some text to read.", "questions": ["q?"], "answers": [["1"]],
                        "metadata": {"source": source}}) + "\n"
            for source in sources
        ),
        encoding="utf-8",
    )
    loaded, _ = load_instances(path, tokenizer=tokenizer, chunk_tokens=64)
    assert [i.data_source for i in loaded] == sources
    found = [builtin.for_source(i.data_source) for i in loaded]
    assert BOXED in found[0] and "summary of the book" in found[1] and found[2] is None


def test_the_instruction_opens_the_user_message_one_empty_line_before_the_question():
    messages = answer_messages("(memory)", "Sentence: x\nWhich label?", "Box the label.")
    assert messages[1] == {"role": "user", "content": "Box the label.\n\nSentence: x\nWhich label?"}
    assert answer_messages("(memory)", "Which label?", None)[1]["content"] == "Which label?"
    assert messages[0] == answer_messages("(memory)", "other", None)[0]  # the system message is shared


def test_the_table_ships_in_the_wheel():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    patterns = pyproject["tool"]["setuptools"]["package-data"]["memalpha.reader"]
    assert any(fnmatch(BUILTIN_FILE, pattern) for pattern in patterns)
    assert (REPO / "memalpha" / "reader" / BUILTIN_FILE).is_file()


# ---------------------------------------------------------------------------------------
# replacing the table
# ---------------------------------------------------------------------------------------


def test_a_replacement_file_is_used_and_the_builtin_table_is_not(tmp_path):
    table = tmp_path / "mine.yaml"
    table.write_text(
        "my_set: |\n  Answer in French.\n"  # a block scalar: its last newline is dropped
        "pubmed-rct: null\n"
        '"lab_*": Narrow pattern first.\n'
        '"lab*": Broad pattern.\n'
        'lab_exact: Exact name.\n',
        encoding="utf-8",
    )
    reader = ReaderSettings(kind="openai", question_instructions=str(table)).build(None, None)
    assert reader.instruction_for("my_set") == "Answer in French."
    assert reader.instruction_for("pubmed-rct") is None
    assert reader.instruction_for("icl_banking77_5900shot_balance") is None
    assert reader.instruction_for("lab_x") == "Narrow pattern first."  # the first matching pattern wins
    assert reader.instruction_for("labx") == "Broad pattern."
    assert reader.instruction_for("lab_exact") == "Exact name."  # an exact name beats every pattern


@pytest.mark.parametrize("text", ["", "# only a comment\n", "{}\n"])
def test_an_empty_file_switches_the_instructions_off(tmp_path, text):
    table = tmp_path / "empty.yaml"
    table.write_text(text, encoding="utf-8")
    assert load_question_instructions(str(table)).for_source("pubmed-rct") is None


def test_null_switches_the_instructions_off_and_the_default_is_the_shipped_table():
    assert (
        ReaderSettings(kind="openai", question_instructions=None).build(None, None).instruction_for("booksum")
        is None
    )
    assert ReaderSettings().question_instructions == BUILTIN
    assert "summary" in ReaderSettings(kind="openai").build(None, None).instruction_for("booksum")


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("pubmed-rct: [1, 2]\n", "'pubmed-rct' must map to a non-empty text or null (none), got list"),
        ("pubmed-rct: '  '\n", "'pubmed-rct' must map to a non-empty text or null (none), got '  '"),
        (
            "- pubmed-rct\n- booksum\n",
            "expected a mapping of data_source names or patterns to instructions, got list",
        ),
        ("just a sentence\n", "expected a mapping of data_source names or patterns to instructions, got str"),
        ("2024: text\n", "key 2024 must be a non-empty data_source name or glob pattern"),
        ("pubmed-rct: [unclosed\n", "not valid YAML at line 2, column 1"),
    ],
)
def test_a_malformed_file_fails_in_one_line_naming_it(tmp_path, text, problem):
    table = tmp_path / "bad.yaml"
    table.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError) as caught:
        ReaderSettings(question_instructions=str(table))
    message = str(caught.value)
    assert message.startswith(f"reader.question_instructions: {table}: ") and problem in message
    assert "\n" not in message


def test_a_missing_file_fails_in_one_line(tmp_path):
    with pytest.raises(
        ValueError, match=r"^reader.question_instructions: \S+absent.yaml: no such file \("
    ) as caught:
        ReaderSettings(question_instructions=str(tmp_path / "absent.yaml"))
    assert "\n" not in str(caught.value)


def test_the_cli_stops_on_a_bad_file_with_one_line(tmp_path, capsys):
    table = tmp_path / "bad.yaml"
    table.write_text("booksum: 3\n", encoding="utf-8")
    with pytest.raises(SystemExit) as caught:
        main(["fit", "--config", str(REPO / "configs" / "tiny_cpu.yaml"),
              "--model.reader.question_instructions", str(table),
              "--trainer.default_root_dir", str(tmp_path / "run")])
    assert str(caught.value) == (
        f"memalpha fit: error: model.reader.question_instructions: {table}: "
        "'booksum' must map to a non-empty text or null (none), got int"
    )
    assert not (tmp_path / "run").exists()  # it stopped before anything ran


# ---------------------------------------------------------------------------------------
# the instruction in the reader's prompt
# ---------------------------------------------------------------------------------------


def labelled_memory() -> Memory:
    memory = Memory()
    memory.core = "Label 0 marks background sentences, label 3 marks results."
    for i in range(8):
        memory.insert(SEMANTIC, f"Sample: the trial {i} enrolled {10 * i} patients. Label: {i % 5}")
        memory.insert(EPISODIC, f"At 2024-01-{i + 1:02d} the user read abstract {i}.")
    return memory


def test_the_prompt_budget_counts_the_instruction_and_retrieval_ignores_it(builtin, tokenizer):
    memory, question = labelled_memory(), "Sentence: the trial 3 enrolled 30 patients.\n\nWhich label?"
    reader = LocalReader(
        None, tokenizer, retrieval=RetrievalSettings(top_k_entries=8), question_instructions=builtin
    )
    instruction = builtin.for_source("pubmed-rct")
    bare = reader.answer_conversations([(memory, question)])[0]
    told = reader.answer_conversations([(memory, question)], ["pubmed-rct"])[0]
    assert told[0] == bare[0]  # same entries, same order: the instruction is not part of the search
    assert told[1]["content"] == f"{instruction}\n\n{question}"
    # a budget that the bare prompt meets exactly: with the instruction, entries must go
    reader.prompt_budget_tokens = reader.conversation_tokens(bare)
    fitted = reader.answer_conversations([(memory, question)], ["pubmed-rct"])[0]
    assert reader.conversation_tokens(fitted) <= reader.prompt_budget_tokens
    assert len(fitted[0]["content"]) < len(bare[0]["content"])


def test_the_reader_model_receives_the_instruction_before_the_question(
    tiny_model_dir, tokenizer, monkeypatch
):
    import torch
    from transformers import AutoModelForCausalLM

    from memalpha.lm.sampling import generation

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    seen: list[list[int]] = []
    original = generation.generate

    def recording_generate(model, tokenizer, prompt_ids, **kwargs):
        seen.extend(prompt_ids)
        return original(model, tokenizer, prompt_ids, **kwargs)

    monkeypatch.setattr(generation, "generate", recording_generate)
    (pubmed,), _ = load_instances(PUBMED_PARQUET, limit=1)
    pubmed = Instance(pubmed.instance_id, pubmed.data_source, pubmed.chunks[:1], pubmed.questions[:2])
    squad = Instance("squad-1", "squad", ["Oslo is in Norway."], [QA("Where is Oslo?", "Norway")])
    rollouts = start_rollouts([pubmed, squad], 1, RolloutSettings(), lambda text: len(text.split()), seed=0)
    rollouts[0].memory = labelled_memory()
    reader = ReaderSettings(max_new_tokens=2, temperature=0.0).build(model, tokenizer)

    answered = answer_questions(rollouts, reader)

    prompts = [
        tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False) for ids in seen
    ]
    assert len(prompts) == 3
    instruction = reader.instruction_for("pubmed-rct")
    for qa in pubmed.questions:
        turn = f"<|im_start|>user\n{instruction}\n\n{qa.question}<|im_end|>"
        assert sum(turn in p for p in prompts) == 1
    assert sum("<|im_start|>user\nWhere is Oslo?<|im_end|>" in p for p in prompts) == 1
    # the record keeps the bare question and, apart, the instruction the reader got
    records = answered[0].questions + answered[1].questions
    assert [r["question"] for r in records] == [qa.question for qa in pubmed.questions] + ["Where is Oslo?"]
    assert [r["instruction"] for r in records] == [instruction, instruction, None]
