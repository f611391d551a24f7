"""The ``longmemeval`` layout (memalpha/data/longmemeval.py): a question record's sessions as chunks,
its answer sessions as the question's evidence, the errors naming the record and field, and a real
fit with per-chunk credit on such a file."""

from __future__ import annotations

import json

import pytest
import yaml
from test_training import scalars, version_dirs, write_config

from memalpha.cli import main
from memalpha.data.loaders import load_instances
from memalpha.data.schema import DataValidationError, question_evidence


def record(n: int = 0, **changes) -> dict:
    """A LongMemEval-style record written for these tests: three dated sessions, the answer in the second."""
    value = {
        "question_id": f"q{n}",
        "question_type": "single-session-user",
        "question": "Which city did I move to?",
        "answer": "Bergen",
        "question_date": "2023/05/30 (Tue) 10:00",
        "haystack_session_ids": [f"s{n}a", f"s{n}b", f"s{n}c"],
        "haystack_dates": ["2023/05/01 (Mon) 09:00", "2023/05/08 (Mon) 09:00", "2023/05/15 (Mon) 09:00"],
        "haystack_sessions": [
            [{"role": "user", "content": "Any tips for growing basil?"},
             {"role": "assistant", "content": "Sun and regular water."}],
            [{"role": "user", "content": "I just moved to Bergen and need a raincoat.", "has_answer": True},
             {"role": "assistant", "content": "A long shell jacket works well there."}],
            [{"role": "user", "content": "How long to boil an egg?"},
             {"role": "assistant", "content": "About nine minutes."}],
        ],
        "answer_session_ids": [f"s{n}b"],
    }  # fmt: skip
    return {**value, **changes}


def write(tmp_path, records, name="longmemeval_s.json"):
    path = tmp_path / name
    path.write_text(json.dumps(records), encoding="utf-8")
    return path


def test_a_record_becomes_one_instance_with_a_chunk_per_session_and_its_evidence(tmp_path):
    instances, report = load_instances(write(tmp_path, [record(0), record(1)]))
    assert report.layout == "longmemeval" and [i.instance_id for i in instances] == ["q0", "q1"]
    first = instances[0]
    assert first.data_source == "longmemeval" and len(first.chunks) == 3
    assert first.chunks[1] == (
        "[Chat session on 2023/05/08 (Mon) 09:00]\n"
        "<User> I just moved to Bergen and need a raincoat.\n"
        "<Assistant> A long shell jacket works well there."
    )
    (qa,) = first.questions
    assert qa.question == "Which city did I move to?\n(Asked on 2023/05/30 (Tue) 10:00.)"
    assert qa.answer == "Bergen"
    assert first.metadata["evidence_chunks"] == [[1]] and question_evidence(first) == [1]
    assert first.metadata["question_type"] == "single-session-user"


def test_sessions_without_dates_and_a_numeric_answer(tmp_path):
    plain = record(answer=3, question_date=None)
    del plain["haystack_dates"]
    (instance,), _ = load_instances(write(tmp_path, [plain]), layout="longmemeval")
    assert instance.chunks[0].startswith("[Chat session]\n<User> Any tips")
    (qa,) = instance.questions
    assert qa.question == "Which city did I move to?" and qa.answer == "3"


@pytest.mark.parametrize(
    ("changes", "field", "reason"),
    [
        ({"answer_session_ids": ["nope"]}, "answer_session_ids[0]", "is not one of its haystack_session_ids"),
        ({"haystack_session_ids": ["a", "b"]}, "haystack_session_ids", "2 ids for 3 sessions"),
        ({"haystack_dates": ["2023/05/01"]}, "haystack_dates", "1 dates for 3 sessions"),
        ({"haystack_sessions": [[{"role": "system", "content": "x"}]], "haystack_session_ids": ["a"],
          "haystack_dates": None}, "haystack_sessions[0][0].role", "expected one of ['assistant', 'user']"),
        ({"haystack_sessions": []}, "haystack_sessions", "no session"),
        ({"answer": None}, "answer", "missing field"),
    ],
)  # fmt: skip
def test_a_bad_record_is_one_line_naming_the_file_record_and_field(tmp_path, changes, field, reason):
    path = write(tmp_path, [record(0), record(1, **changes)])
    with pytest.raises(DataValidationError) as error:
        load_instances(path)
    message = str(error.value)
    assert str(path) in message and "record 1" in message and f"'{field}'" in message and reason in message
    assert "\n" not in message


def test_a_record_without_answer_sessions_trains_broadcast_only(tmp_path):
    (instance,), _ = load_instances(write(tmp_path, [record(answer_session_ids=[])]))
    assert "evidence_chunks" not in instance.metadata
    with pytest.raises(DataValidationError, match="metadata.evidence_chunks"):
        question_evidence(instance)


def test_a_fit_with_per_chunk_credit_reads_the_evidence_of_a_longmemeval_file(tmp_path, tiny_model_dir):
    data = write(tmp_path, [record(n) for n in range(4)])
    config = write_config(tmp_path, tiny_model_dir, max_steps=1, train_path=str(data), val_path=str(data))
    raw = yaml.safe_load(config.read_text())
    raw["trainer"].update(limit_val_batches=0)
    config.write_text(yaml.safe_dump(raw))
    main(["fit", "--config", str(config), "--model.update.credit", "per_chunk"])
    logged = scalars(version_dirs(tmp_path)[-1])
    # 2 instances x 2 rollouts: the question is asked again after turns 1 (its evidence) and 2 is the last
    assert list(logged["reader/turn_questions"].values()) == [4.0]
