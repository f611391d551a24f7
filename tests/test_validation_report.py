"""The validation summary's two accuracies: per question, and per instance (the official average)."""

from __future__ import annotations

import pytest

from memalpha.agent.rollout import RolloutRecord
from memalpha.train.validation_report import format_table, summarise_records


def record(instance_id: str, source: str, scores: list[float]) -> RolloutRecord:
    questions = [{"score": score, "error": None} for score in scores]
    return RolloutRecord(instance_id, source, 0, [], {}, 0, 10, questions)


def test_question_mean_and_instance_mean_differ_when_instances_hold_different_question_counts():
    records = [
        record("a", "pubmed-rct", [1.0, 1.0, 1.0, 0.0]),  # 3 of 4
        record("b", "pubmed-rct", [0.0]),  # 0 of 1
        record("c", "squad", [1.0, 0.0]),  # 1 of 2
    ]
    summary = summarise_records(records)
    pubmed = summary["per_source"]["pubmed-rct"]
    assert pubmed["accuracy"] == pytest.approx(3 / 5)  # every question weighs the same
    assert pubmed["accuracy_by_instance"] == pytest.approx((3 / 4 + 0) / 2)  # every instance weighs the same
    overall = summary["overall"]
    assert overall["accuracy"] == pytest.approx(4 / 7)
    assert overall["accuracy_by_instance"] == pytest.approx((3 / 4 + 0 + 1 / 2) / 3)
    header, _, *rows = format_table(summary).splitlines()
    assert header.split()[3:5] == ["accuracy", "accuracy_by_instance"]
    assert rows[0].split()[3:5] == ["0.600", "0.375"]


def test_rollouts_of_one_instance_are_pooled_before_the_instance_mean():
    records = [
        record("a", "squad", [1.0, 1.0]),
        record("a", "squad", [0.0, 0.0]),
        record("b", "squad", [1.0]),
    ]
    summary = summarise_records(records)["overall"]
    assert summary["accuracy_by_instance"] == pytest.approx((2 / 4 + 1) / 2)
    assert summary["instances"] == 2


def test_replies_cut_at_the_cap_are_counted_and_said_under_the_table():
    def turn(truncated: bool) -> dict:
        return {"results": [{"status": "ok"}], "truncated": truncated, "reward": 1.0}

    answered = [{"score": 1.0, "error": None}]
    cut = RolloutRecord("a", "squad", 0, [turn(True), turn(False)], {}, 0, 10, answered)
    whole = RolloutRecord("b", "squad", 0, [turn(False)], {}, 0, 10, [{"score": 0.0, "error": None}])
    summary = summarise_records([cut, whole])
    assert (summary["overall"]["turns"], summary["overall"]["replies_cut"]) == (3, 1)
    assert "1 of 3 replies were cut at model.rollout.max_new_tokens" in format_table(summary)
    assert "replies were cut" not in format_table(summarise_records([whole]))
