"""memalpha predict's JSONL file without a model (memalpha/train/predict_file.py): complete lines
read back, torn tails recognised and cut, foreign lines refused, and the output and any ranks'
parts merged in input order, each instance once, the parts removed."""

from __future__ import annotations

import json

import pytest

from memalpha.train.predict_file import (
    RECORD_FORMAT,
    PredictionFileError,
    append_record,
    drop_torn_tail,
    in_order,
    merge_records,
    part_path,
    part_paths,
    scan_records,
)

ORDER = {name: i for i, name in enumerate("abcde")}


def record(instance_id: str, agent: str = "A") -> dict:
    return {"format": RECORD_FORMAT, "agent": agent, "instance_id": instance_id, "memory": {"core": "ü"}}


def write(path, *ids: str, tail: bytes = b"") -> None:
    with open(path, "ab") as handle:
        for instance_id in ids:
            append_record(handle, record(instance_id))
        handle.write(tail)


def test_complete_records_are_read_and_a_torn_tail_is_cut(tmp_path):
    path = tmp_path / "out.jsonl"
    write(path, "a", "b")
    complete = path.read_bytes()
    torn = (json.dumps(record("c")) + "\n").encode()[:60]
    write(path, tail=torn)
    scan = scan_records(path, "A", ORDER)
    assert [r[0] for r in scan.records] == ["a", "b"] and scan.torn_bytes == 60
    drop_torn_tail(scan)
    assert path.read_bytes() == complete
    assert scan_records(tmp_path / "missing.jsonl", "A", ORDER).records == []


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"format": "memalpha.prediction/1", "agent": "A", "instance_id": "a"}\nnot json\n',
         "line 2 is not a memalpha prediction record"),
        (b"no newline and not ours", "line 1 is not a memalpha prediction record"),
        (b'{"format": "memalpha.prediction/1", "agent": "B", "instance_id": "a"}\n',
         "line 1 was written by another agent or with other settings (agent 'B', this run 'A')"),
        (b'{"format": "memalpha.prediction/1", "agent": "A", "instance_id": "q"}\n',
         "line 1 holds instance 'q', which data.predict.path does not"),
    ],
)
def test_a_file_that_is_not_this_runs_is_refused_and_kept(tmp_path, content, message):
    path = tmp_path / "out.jsonl"
    path.write_bytes(content)
    with pytest.raises(PredictionFileError) as error:
        scan_records(path, "A", ORDER)
    assert str(error.value).startswith(f"{path}: ") and message in str(error.value)
    assert path.read_bytes() == content


def test_the_output_and_the_parts_of_any_world_size_merge_in_input_order(tmp_path):
    output = tmp_path / "out.jsonl"
    write(output, "d", "a")
    write(part_path(output, 0), "b", tail=b'{"format": "memal')
    write(part_path(output, 3), "e", "a")  # a leftover of a four-rank run, "a" written twice
    (tmp_path / "out.jsonl.rankx.part").write_text("not a part\n")
    parts = part_paths(output)
    assert parts == [part_path(output, 0), part_path(output, 3)]
    scans = [scan_records(path, "A", ORDER) for path in (output, *parts)]
    assert not in_order(scans[0], ORDER)
    assert merge_records(output, scans, ORDER) == 4
    merged = [json.loads(line)["instance_id"] for line in output.read_text(encoding="utf-8").splitlines()]
    assert merged == ["a", "b", "d", "e"]
    assert part_paths(output) == [] and (tmp_path / "out.jsonl.rankx.part").exists()
    assert in_order(scan_records(output, "A", ORDER), ORDER)
