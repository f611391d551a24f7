"""Instance schema: round trips and one clear error per bad record (file, record, field)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from memalpha.data.loaders import load_instances, save_jsonl
from memalpha.data.schema import QA, DataValidationError, parse_record

MALFORMED = Path(__file__).parent / "fixtures" / "data" / "malformed"

# file -> (instance id shown for the bad record, field named, words of the reason)
ERROR_KINDS = {
    "missing_field.jsonl": ("inst-1", "data_source", "missing field"),
    "wrong_type.jsonl": ("inst-1", "chunks", "expected a list, got string"),
    "empty_chunks.jsonl": ("inst-1", "chunks", "empty chunk list"),
    "question_without_answer.jsonl": ("inst-1", "questions[1].answer", "question without answer"),
    "duplicate_id.jsonl": ("inst-0", "instance_id", "duplicate instance id (first used by record 0)"),
}


def _good(i: int = 0) -> dict:
    return {
        "instance_id": f"inst-{i}",
        "data_source": "toy",
        "chunks": ["first chunk", "second chunk"],
        "questions": [{"question": "q?", "answer": "a"}, {"question": "q2?", "answer": ["x", "y"]}],
        "metadata": {"k": 1},
    }


def test_instance_round_trip_keeps_list_answers():
    instance = parse_record(_good())
    assert instance.questions[1] == QA("q2?", ["x", "y"])
    assert instance.to_dict() == _good()
    assert parse_record(instance.to_dict()) == instance


@pytest.mark.parametrize("name", sorted(ERROR_KINDS))
def test_each_error_kind_names_file_record_and_field(name):
    path = MALFORMED / name
    instance_id, field, reason = ERROR_KINDS[name]
    with pytest.raises(DataValidationError) as info:
        load_instances(path)
    err = info.value
    message = str(err)
    assert str(path) in message
    assert f"record 1 (instance_id={instance_id!r})" in message
    assert f"field {field!r}" in message
    assert reason in message
    assert (err.file, err.index, err.instance_id, err.field) == (str(path), 1, instance_id, field)


def test_bad_json_line_names_file_record_and_line():
    path = MALFORMED / "bad_json.jsonl"
    with pytest.raises(
        DataValidationError, match=r"bad_json\.jsonl: record 1 \(no instance_id\): line 2 is not valid JSON"
    ):
        load_instances(path)


@pytest.mark.parametrize("name", sorted(ERROR_KINDS) + ["bad_json.jsonl"])
def test_skip_bad_skips_reports_and_counts(name, caplog):
    path = MALFORMED / name
    with caplog.at_level(logging.WARNING, logger="memalpha.data"):
        instances, report = load_instances(path, skip_bad=True)
    assert [i.instance_id for i in instances] == ["inst-0", "inst-2"]
    assert (report.records, report.loaded, report.num_skipped) == (3, 2, 1)
    index, reason = report.skipped[0]
    assert index == 1 and str(path) in reason
    assert "skipping bad record" in caplog.text and "skipped 1 of 3 records" in caplog.text


def test_nothing_half_loads(tmp_path):
    """A bad last record refuses the file: no partial list comes back."""
    path = tmp_path / "data.jsonl"
    bad = _good(1)
    bad["questions"][0]["answer"] = ""
    path.write_text(json.dumps(_good(0)) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(DataValidationError, match=r"field 'questions\[0\]\.answer': question without answer"):
        load_instances(path)


@pytest.mark.parametrize(
    ("mutate", "field", "reason"),
    [
        (lambda r: r.update(instance_id=7), "instance_id", "expected a string, got int"),
        (lambda r: r.update(data_source=""), "data_source", "empty string"),
        (lambda r: r["chunks"].append(3), "chunks[2]", "expected a string, got int"),
        (lambda r: r.update(questions=[]), "questions", "empty question list"),
        (lambda r: r["questions"].append("q3?"), "questions[2]", "expected an object, got string"),
        (
            lambda r: r["questions"][0].update(answer=[]),
            "questions[0].answer",
            "question without answer (empty list)",
        ),
        (lambda r: r["questions"][0].update(answer=3), "questions[0].answer", "expected a string or a list"),
        (lambda r: r["questions"][0].pop("question"), "questions[0].question", "missing field"),
        (lambda r: r.update(metadata=[1]), "metadata", "expected an object, got list"),
        (lambda r: r.update(chunk=["x"]), "chunk", "unknown field"),
    ],
)
def test_field_checks(mutate, field, reason):
    record = _good()
    mutate(record)
    with pytest.raises(DataValidationError) as info:
        parse_record(record, file="mem.jsonl", index=4)
    assert info.value.field == field and info.value.index == 4
    assert reason in str(info.value) and str(info.value).startswith("mem.jsonl: record 4 (")


def test_save_jsonl_is_atomic_and_round_trips(tmp_path):
    target = tmp_path / "sub" / "out.jsonl"
    instances = [parse_record(_good(i)) for i in range(3)]
    save_jsonl(instances, target)
    assert load_instances(target)[0] == instances
    umask = os.umask(0o022)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask  # the usual file mode, not mkstemp's 0600

    def exploding():
        yield instances[0]
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        save_jsonl(exploding(), target)
    assert load_instances(target)[0] == instances  # the old file is untouched
    assert [p.name for p in target.parent.iterdir()] == ["out.jsonl"]  # no temp file left
