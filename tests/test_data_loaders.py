"""Every loader: memalpha JSONL/JSON/parquet/saved datasets, the official Mem-α parquet, MemoryAgentBench."""

from __future__ import annotations

import hashlib
import json
from datetime import date, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from memalpha.data.loaders import load_instances, save_jsonl
from memalpha.data.schema import DataValidationError, parse_record
from memalpha.data.wrapping import parse_wrapped_chunk

FIXTURES = Path(__file__).parent / "fixtures" / "data"
PUBMED_PARQUET = FIXTURES / "memalpha_pubmed.parquet"
PUBMED_SOURCE = Path("/work/shared/data/memalpha4b-pubmed/instances.jsonl")
# printed by tests/fixtures/data/make_memalpha_pubmed_parquet.py for the three source instances
PUBMED_SHA256 = "e81a3b8532f3cbe00b88a0ce908ab8f5f0c997087548ee74159224318e8c2804"


def _canonical_sha256(records: list[dict]) -> str:
    text = "".join(json.dumps(r, sort_keys=True, ensure_ascii=False) + "\n" for r in records)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _own(i: int, answer="a") -> dict:
    return {
        "instance_id": f"own-{i}",
        "data_source": "toy",
        "chunks": [f"chunk {i}.0 with café", f"chunk {i}.1"],
        "questions": [{"question": f"question {i}?", "answer": answer}],
        "metadata": {"n": i},
    }


# ---------------------------------------------------------------------------
# the official Mem-α parquet layout: the real PubMed-RCT fixture
# ---------------------------------------------------------------------------


def test_official_parquet_fixture_loads_the_real_instances():
    instances, report = load_instances(PUBMED_PARQUET)
    assert report.layout == "memalpha" and report.loaded == 3 and not report.skipped
    assert [i.instance_id for i in instances] == [f"memalpha-pubmed-rct-{k}" for k in range(3)]
    for instance in instances:
        assert instance.data_source == "pubmed-rct"
        assert len(instance.chunks) == 10 and len(instance.questions) == 100
        assert instance.chunks[0].startswith(
            "[Dialogue between User and Assistant on 2024-01-01 00:00]\n<User>"
        )
        assert {qa.answer for qa in instance.questions} <= {"0", "1", "2", "3", "4"}  # bare labels
        assert "prompt" in instance.metadata  # the official prompt column is kept in metadata
    records = []
    for instance in instances:
        record = instance.to_dict()
        record["metadata"].pop("prompt")
        records.append(record)
    assert _canonical_sha256(records) == PUBMED_SHA256  # exactly the recorded instances, no text changed
    if PUBMED_SOURCE.is_file():  # the shared source, where this machine has it
        source = [json.loads(line) for line in PUBMED_SOURCE.read_text(encoding="utf-8").splitlines()]
        assert records == source


def _official_row(**overrides) -> dict:
    row = {
        "instance_id": "off-0",
        "prompt": "Remember things.",
        "chunks": json.dumps(["c0", "c1"]),
        "questions_and_answers": json.dumps([{"question": "q?", "answer": "a", "evidence_idx": 1}]),
        "data_source": "squad",
        "metadata": json.dumps({"origin": "test"}),
        "num_chunks": 2,
        "num_questions": 1,
    }
    row.update(overrides)
    return row


def _write_parquet(path: Path, rows: list[dict]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_official_layout_decodes_and_coerces(tmp_path):
    rows = [
        _official_row(),
        _official_row(
            instance_id="off-1",
            questions_and_answers=json.dumps([{"question": "label?", "answers": [3, "three"]}]),
            data_source="trec-coarse",
        ),
    ]
    instances, _ = load_instances(_write_parquet(tmp_path / "official.parquet", rows))
    assert instances[0].chunks == ["c0", "c1"] and instances[0].questions[0].answer == "a"
    assert instances[0].metadata == {"prompt": "Remember things.", "origin": "test"}
    assert instances[1].questions[0].answer == ["3", "three"]  # "answers" accepted, numbers made strings


@pytest.mark.parametrize(
    ("override", "field", "reason"),
    [
        ({"chunks": '["c0", "c1"'}, "chunks", "not valid JSON"),
        ({"num_chunks": 3}, "num_chunks", "says 3 but the decoded list has 2"),
        (
            {"questions_and_answers": json.dumps([{"question": "q?"}])},
            "questions_and_answers[0].answer",
            "without answer",
        ),
        ({"metadata": json.dumps([1, 2])}, "metadata", "expected an object"),
    ],
)
def test_official_layout_errors_name_the_column(tmp_path, override, field, reason):
    path = _write_parquet(
        tmp_path / "bad.parquet", [_official_row(instance_id="ok-0"), _official_row(**override)]
    )
    with pytest.raises(DataValidationError) as info:
        load_instances(path)
    assert str(path) in str(info.value) and "record 1 (instance_id='off-0')" in str(info.value)
    assert info.value.field == field and reason in str(info.value)


def test_forced_layout_reports_the_missing_column(tmp_path):
    path = tmp_path / "own.jsonl"
    save_jsonl([parse_record(_own(0))], path)
    with pytest.raises(DataValidationError, match="field 'questions_and_answers': missing field"):
        load_instances(path, layout="memalpha")


# ---------------------------------------------------------------------------
# memalpha's own layout in every container
# ---------------------------------------------------------------------------


def test_own_layout_loads_identically_from_every_container(tmp_path):
    import datasets

    records = [_own(i) for i in range(3)]
    expected = [parse_record(r) for r in records]
    save_jsonl(expected, tmp_path / "a.jsonl")
    (tmp_path / "b.json").write_text(json.dumps(records))
    (tmp_path / "c.json").write_text(json.dumps({"instances": records}))
    _write_parquet(tmp_path / "d.parquet", records)
    datasets.Dataset.from_list(records).save_to_disk(str(tmp_path / "saved"))
    for name in ("a.jsonl", "b.json", "c.json", "d.parquet", "saved"):
        assert load_instances(tmp_path / name)[0] == expected, name
    assert load_instances(tmp_path / "a.jsonl", limit=2)[0] == expected[:2]


def test_folder_and_dataset_dict_splits(tmp_path):
    import datasets

    train = [parse_record(_own(i)) for i in range(2)]
    val = [parse_record(_own(i + 10)) for i in range(1)]
    save_jsonl(train, tmp_path / "plain" / "train.jsonl")
    save_jsonl(val, tmp_path / "plain" / "validation.jsonl")
    assert load_instances(tmp_path / "plain", split="train")[0] == train
    assert load_instances(tmp_path / "plain", split="validation")[0] == val
    with pytest.raises(DataValidationError, match="several data files .*choose one with split="):
        load_instances(tmp_path / "plain")
    with pytest.raises(DataValidationError, match="no data file for split 'test'"):
        load_instances(tmp_path / "plain", split="test")

    dd = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_list([i.to_dict() for i in train]),
            "validation": datasets.Dataset.from_list([i.to_dict() for i in val]),
        }
    )
    dd.save_to_disk(str(tmp_path / "dd"))
    assert load_instances(tmp_path / "dd", split="validation")[0] == val
    with pytest.raises(DataValidationError, match="several splits \\(train, validation\\)"):
        load_instances(tmp_path / "dd")
    with pytest.raises(DataValidationError, match="no split 'test'"):
        load_instances(tmp_path / "dd", split="test")


def test_unreadable_sources_are_named(tmp_path):
    with pytest.raises(DataValidationError, match="no such file or folder"):
        load_instances(tmp_path / "missing.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DataValidationError, match="empty.jsonl: no records"):
        load_instances(tmp_path / "empty.jsonl")
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(DataValidationError, match="unsupported file type '.csv'"):
        load_instances(tmp_path / "x.csv")
    (tmp_path / "broken.parquet").write_bytes(b"not parquet")
    with pytest.raises(DataValidationError, match="broken.parquet: cannot read parquet"):
        load_instances(tmp_path / "broken.parquet")


def test_hub_name_offline_gives_a_clear_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DataValidationError, match="nobody-here/no-such-dataset: cannot load hub dataset"):
        load_instances("nobody-here/no-such-dataset", split="train")


# ---------------------------------------------------------------------------
# MemoryAgentBench layout
# ---------------------------------------------------------------------------

CONTEXT = " ".join(f"Fact {i}: the café on street {i} serves 日本茶 and crème brûlée ☕." for i in range(120))


def _mab(i: int, **overrides) -> dict:
    record = {
        "context": CONTEXT,
        "questions": ["Which street serves tea?", "What is served?"],
        "answers": [["street 3", "3"], ["crème brûlée"]],
        "metadata": {"source": "ruler_qa", "qa_pair_ids": [f"p{i}-0", f"p{i}-1"]},
    }
    record.update(overrides)
    return record


def test_memoryagentbench_chunks_by_tokens_without_losing_text(tmp_path, tokenizer):
    path = tmp_path / "mab.jsonl"
    # JSON may mix answer kinds
    records = [_mab(i, answers=[["street 3", "3"], "crème brûlée"]) for i in range(2)]
    path.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in records) + "\n", encoding="utf-8")
    instances, report = load_instances(path, tokenizer=tokenizer, chunk_tokens=256)
    assert report.layout == "memoryagentbench"
    assert [i.instance_id for i in instances] == ["ruler_qa-0", "ruler_qa-1"]
    first = instances[0]
    assert first.data_source == "ruler_qa" and first.metadata["qa_pair_ids"] == ["p0-0", "p0-1"]
    assert first.metadata["chunk_tokens"] == 256
    assert first.questions[0].answer == ["street 3", "3"] and first.questions[1].answer == "crème brûlée"
    assert "".join(first.chunks) == CONTEXT
    total = len(tokenizer(CONTEXT, add_special_tokens=False)["input_ids"])
    assert len(first.chunks) == -(-total // 256)
    for chunk in first.chunks:
        assert len(tokenizer(chunk, add_special_tokens=False)["input_ids"]) <= 256 + 1


def test_memoryagentbench_wrapping_keeps_the_text(tmp_path, tokenizer):
    path = tmp_path / "mab.parquet"
    _write_parquet(path, [_mab(0, instance_id="given-id")])
    (instance,), _ = load_instances(path, tokenizer=tokenizer, chunk_tokens=300, wrap="dialogue")
    assert instance.instance_id == "given-id" and instance.metadata["wrap"] == "dialogue"
    parsed = [parse_wrapped_chunk(c) for c in instance.chunks]
    assert [p.day for p in parsed] == [date(2024, 1, 1) + timedelta(days=k) for k in range(len(parsed))]
    assert "".join(p.text for p in parsed) == CONTEXT
    (reading,), _ = load_instances(path, tokenizer=tokenizer, chunk_tokens=300, wrap="reading")
    assert reading.chunks[1].startswith("[Reading event on 2024-01-02: the user is reading a book]\n<User> ")
    assert "".join(parse_wrapped_chunk(c).text for c in reading.chunks) == CONTEXT


def test_memoryagentbench_saved_dataset_dict(tmp_path, tokenizer):
    import datasets

    dd = datasets.DatasetDict(
        {
            "Accurate_Retrieval": datasets.Dataset.from_list([_mab(0)]),
            "Test_Time_Learning": datasets.Dataset.from_list([_mab(1, metadata={"source": "icl_banking77"})]),
        }
    )
    dd.save_to_disk(str(tmp_path / "mab"))
    (instance,), _ = load_instances(
        tmp_path / "mab", split="Test_Time_Learning", tokenizer=tokenizer, chunk_tokens=1024
    )
    assert instance.data_source == "icl_banking77" and "".join(instance.chunks) == CONTEXT


@pytest.mark.parametrize(
    ("override", "field", "reason"),
    [
        ({"answers": ["only one"]}, "answers", "1 answers for 2 questions"),
        ({"metadata": {"qa_pair_ids": []}}, "metadata.source", "missing field"),
        ({"answers": [["a"], []]}, "answers[1]", "question without answer"),
        ({"context": 12}, "context", "expected a string"),
    ],
)
def test_memoryagentbench_errors(tmp_path, tokenizer, override, field, reason):
    path = tmp_path / "mab.jsonl"
    path.write_text(json.dumps(_mab(0)) + "\n" + json.dumps(_mab(1, **override)) + "\n")
    with pytest.raises(DataValidationError) as info:
        load_instances(path, tokenizer=tokenizer, chunk_tokens=512)
    assert str(path) in str(info.value) and info.value.index == 1
    assert info.value.field == field and reason in str(info.value)


def test_memoryagentbench_needs_a_tokenizer(tmp_path):
    path = tmp_path / "mab.jsonl"
    path.write_text(json.dumps(_mab(0)) + "\n")
    with pytest.raises(DataValidationError, match="pass tokenizer="):
        load_instances(path)
