"""`memalpha validate --profile official` end to end on the processed MemoryAgentBench layout.

A tiny random model of the Qwen3 architecture (the embedded model's tokenizer) stands in for a local
copy of the published checkpoint (``--model.model PATH``, no adapter: a fresh LoRA whose B is zero),
and a small parquet in the layout of the official processed evaluation set
(``YuWangX/Memalpha-Memoryagentbench``, ``test.parquet``) stands in for that file. The agent decodes
greedily with 2,048 new tokens per chunk turn, as the official evaluation does; a random model never
writes its end token, so every turn runs the whole budget, which the test checks.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
import yaml

from memalpha.cli import main
from memalpha.data.loaders import load_instances

AGENT_TOKENS = 2048  # the official evaluation's agent budget (rollout.max_new_tokens' default)

PROMPT = "Store what the chunks say."  # the official rows carry a task prompt; ours is our own text

# (data_source, official split bucket, chunks, [(question, answer)])
ROWS = [
    (
        "icl_banking77_5900shot_balance",
        "accurate_retrieval",
        ["Sentence: where is my card\nLabel: 11\n\nSentence: card not here yet\nLabel: 11",
         "Sentence: top up failed\nLabel: 58"],
        [("Sentence: my card is late", ["11"]), ("Sentence: topping up did not work", ["58"])],
    ),
    (
        "infbench_sum_eng_shots2",
        "long_range_understanding",
        ["[2024-01-01] The keeper lit the lamp every night until the storm took the tower."],
        [("Summarise the book I read from 2024-01-01 to 2024-01-01.", ["keeper", "lamp", "storm"])],
    ),
    (
        "ruler_qa1_197K",
        "accurate_retrieval",
        ["Document 1: The bridge at Arlen was built in 1911 by the river guild."],
        [("Who built the bridge at Arlen?", ["the river guild"]), ("When was it built?", ["1911"])],
    ),
    (
        "longmemeval_s*",
        "accurate_retrieval",
        ["[Dialogue at 2023/05/20] <User> I adopted a cat named Pepper. <Assistant> Lovely!"],
        [("What is the name of my cat?", "Pepper")],
    ),
]


def write_official_parquet(path: Path) -> Path:
    """Rows as the official merge writes them: JSON-string columns, integer ids, the MemoryAgentBench
    source in ``data_source`` and the split bucket in ``metadata`` (with ``sub_source`` and
    ``reading_dates``)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = []
    for number, (source, bucket, chunks, qas) in enumerate(ROWS):
        qa = [{"question": q, "answer": a} for q, a in qas]
        # pandas fills the column that only the long-range rows have with NaN, which json.dumps
        # writes as a bare NaN: the real file's metadata strings hold it
        dates = (
            {"start": "2024-01-01", "end": "2024-01-01"} if bucket == "long_range_understanding" else math.nan
        )
        rows.append(
            {
                "instance_id": number,
                "prompt": PROMPT,
                "chunks": json.dumps(chunks),
                "questions_and_answers": json.dumps(qa),
                "data_source": source,
                "metadata": json.dumps({"data_source": bucket, "sub_source": source, "reading_dates": dates}),
                "num_chunks": len(chunks),
                "num_questions": len(qa),
            }
        )
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def tiny_qwen3_folder(path: Path, tokenizer) -> str:
    """A random two-layer Qwen3 (hidden size 32) with the embedded tokenizer, saved to ``path``."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=16384,
        tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = Qwen3ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def write_validate_config(tmp_path: Path, data: Path) -> Path:
    """The run's machine and sizes only: every GRPO/reader/reward option comes from the profile or its
    default (the agent's decoding among them), except the reader's answer length, shortened for time."""
    config = {
        "profile": "official",
        "seed_everything": 0,
        "trainer": {
            "accelerator": "cpu",
            "devices": 1,
            "num_sanity_val_steps": 0,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "logger": {
                "class_path": "lightning.pytorch.loggers.TensorBoardLogger",
                "init_args": {"save_dir": str(tmp_path / "run"), "name": "tb", "version": "eval"},
            },
        },
        "model": {
            "lm": {"precision": "fp32"},
            "lora": {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": "all-linear"},
            "reader": {"kind": "local", "max_new_tokens": 4, "retrieval": {"prompt_tokens": 4096}},
        },
        "data": {"val_path": str(data), "load": {"layout": "memalpha"}, "val_batch_size": len(ROWS)},
    }
    path = tmp_path / "validate.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_the_official_layout_loads_with_its_sources(tmp_path):
    data = write_official_parquet(tmp_path / "test.parquet")
    instances, report = load_instances(data)  # auto-detected
    assert report.layout == "memalpha" and report.loaded == len(ROWS)
    assert [i.data_source for i in instances] == [row[0] for row in ROWS]
    assert [i.instance_id for i in instances] == ["0", "1", "2", "3"]
    banking, summary, ruler, lme = instances
    assert ruler.questions[1].answer == ["1911"]
    assert banking.chunks == ROWS[0][2] and banking.questions[1].answer == ["58"]
    assert summary.questions[0].answer == ["keeper", "lamp", "storm"]
    assert lme.questions[0].answer == "Pepper"
    assert banking.metadata["prompt"] == PROMPT and banking.metadata["sub_source"] == ROWS[0][0]
    assert summary.metadata["data_source"] == "long_range_understanding"  # the bucket stays in metadata
    assert summary.metadata["reading_dates"] == {"start": "2024-01-01", "end": "2024-01-01"}
    assert math.isnan(banking.metadata["reading_dates"])


def test_validate_with_the_official_profile_on_a_tiny_qwen3(tmp_path, tokenizer, capsys, monkeypatch):
    from memalpha.lm.sampling import generation  # where every local sampler is bound

    calls: list[dict] = []  # the agent's generate calls: their decoding options and what came out
    real_generate = generation.generate

    lora_b: list = []  # the adapter's B matrices as the agent generated with them

    def spy(*args, **kwargs):
        if kwargs.get("announce_as") != "sampling":  # the reader's calls
            return real_generate(*args, **kwargs)
        if not lora_b:
            lora_b.extend(p.detach().clone() for n, p in args[0].named_parameters() if "lora_B" in n)
        generation = real_generate(*args, **kwargs)
        options = {k: kwargs.get(k) for k in ("max_new_tokens", "do_sample")}
        calls.append({**options, "lengths": [len(r) for r in generation.response_ids]})
        return generation

    monkeypatch.setattr(generation, "generate", spy)
    data = write_official_parquet(tmp_path / "test.parquet")
    model_dir = tiny_qwen3_folder(tmp_path / "qwen3-tiny", tokenizer)
    config = write_validate_config(tmp_path, data)
    start = time.perf_counter()
    main(["validate", "--config", str(config), "--model.model", model_dir])
    elapsed = time.perf_counter() - start
    out = capsys.readouterr().out

    report = json.loads((tmp_path / "run" / "tb" / "eval" / "validation.json").read_text())
    per_source = report["summary"]["per_source"]
    assert set(per_source) == {row[0] for row in ROWS}
    for source, _, _, qas in ROWS:
        assert per_source[source]["instances"] == 1, source
        assert per_source[source]["questions"] == len(qas), source
        assert f"\n{source} " in f"\n{out}", f"{source} missing from the printed table"
    overall = report["summary"]["overall"]
    assert overall["instances"] == len(ROWS) and overall["questions"] == sum(len(r[3]) for r in ROWS)
    assert "ALL" in out and "accuracy_by_instance" in out

    # one greedy rollout per instance, one turn per chunk, each the whole 2,048-token budget
    records = report["records"]
    assert sorted(r["instance_id"] for r in records) == ["0", "1", "2", "3"]
    assert all(r["rollout_index"] == 0 for r in records)
    for record in records:
        row = ROWS[int(record["instance_id"])]
        assert [t["chunk_index"] for t in record["turns"]] == list(range(len(row[2])))
        assert all(turn["truncated"] is True for turn in record["turns"])
    # turn 0 of all four instances in one call, then turn 1 of the one with two chunks: greedy,
    # 2,048 new tokens each (the end token never comes from a random model)
    assert calls == [
        {"max_new_tokens": AGENT_TOKENS, "do_sample": False, "lengths": [AGENT_TOKENS] * 4},
        {"max_new_tokens": AGENT_TOKENS, "do_sample": False, "lengths": [AGENT_TOKENS]},
    ], calls
    assert lora_b and all(not b.any() for b in lora_b)  # a fresh adapter: B zero, the base model's outputs
    print(f"validate took {elapsed:.1f} s")


@pytest.mark.parametrize("source", [row[0] for row in ROWS])
def test_each_source_has_a_question_instruction_or_none_on_purpose(source):
    """The official evaluation's sources meet the per-source instruction table (difference 1): the
    classification and summary sources get one, the others get none."""
    from memalpha.reader.question_instructions import load_question_instructions

    text = load_question_instructions("builtin").for_source(source)
    if source.startswith("icl_"):
        assert text and "\\boxed{" in text
    elif source.startswith("infbench_sum"):
        assert text and "summary" in text
    else:
        assert not text
