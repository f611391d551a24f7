"""``memalpha compare``: its math against hand-computed numbers (memalpha/train/instance_scores.py),
the reports it refuses in one line (memalpha/commands/report_checks.py), what it prints and writes,
and the settings a validation report records for it (memalpha/train/validation_report.py)."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from memalpha.agent.reward_settings import RewardSettings
from memalpha.cli import run
from memalpha.commands.compare import format_result
from memalpha.reader.options import OpenAISettings
from memalpha.reader.settings import ReaderSettings
from memalpha.templates.loader import load_templates
from memalpha.train.instance_scores import category_accuracy, change_rows, instance_values, paired_change
from memalpha.train.validation_report import scoring_settings

T3 = 3.182446  # t(0.975) with 3 degrees of freedom
T1 = 12.706205  # with 1
SETTINGS = scoring_settings("tiny", ReaderSettings(), RewardSettings(), load_templates(None))


def record(instance, scores, statuses=(), reward=0.0, *, source="synth", memory=5, fact_recall=None,
           categories=None, chunk_tokens=100):
    """One rollout of ``instance``: its questions' scores (and categories), one turn with those call
    statuses and reward."""
    questions = [{"question": f"q{k}", "gold": f"g{k}", "instruction": None, "score": s}
                 for k, s in enumerate(scores)]
    for question, category in zip(questions, categories or ()):
        question["category"] = category
    return {"data_source": source, "instance_id": instance, "questions": questions,
            "turns": [{"results": [{"status": st} for st in statuses], "reward": reward}],
            "memory_tokens": memory, "chunk_tokens": chunk_tokens, "r3": 0.5, "fact_recall": fact_recall}


# four held-out instances at three stages
BASE = [record("a", [0, 0], [], 0.0, memory=0), record("b", [0, 0], ["error"], 0.0, memory=0),
        record("c", [0, 0], ["ok", "error"], 0.5, memory=4), record("d", [1, 0], ["ok"], 1.0, memory=8)]
SFT = [record("a", [1, 0], ["ok"], 1.0, memory=10), record("b", [0, 1], ["ok"], 1.0, memory=10),
       record("c", [1, 1], ["ok", "ok"], 1.5, memory=12), record("d", [1, 0], ["ok"], 1.0, memory=8)]


def report(records, settings=SETTINGS, **summary):
    overall = {"instances": len({r["instance_id"] for r in records}), "questions": 8, "accuracy": 0.25,
               "fact_recall": None, "tool_success": 0.5, "memory_tokens": 3.0, "compression": 0.5,
               "mean_reward": 0.375}
    out = {"summary": {"overall": overall, "per_source": {}, **summary}, "records": records}
    if settings is not None:
        out["summary"]["settings"] = settings
    return out


def write(path, payload):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload))
    return str(path)


def test_instance_values_average_rollouts_and_leave_out_what_only_some_rollouts_hold():
    records = [record("a", [1, 0], ["ok", "error"], 1.0, fact_recall=0.5),
               record("a", [1, 1], ["ok"], 2.0, memory=7, fact_recall=1.0),
               record("b", [0], [], 0.0, fact_recall=1.0), record("b", [1], ["ok"], 1.0)]
    values = instance_values(records)["synth"]
    # a: accuracy (0.5 + 1) / 2, tool success (0.5 + 1) / 2, memory (5 + 7) / 2, fact recall (0.5 + 1) / 2
    assert values["a"] == {"accuracy": 0.75, "tool_success": 0.75, "memory_tokens": 6.0, "compression": 0.5,
                           "mean_reward": 1.5, "fact_recall": 0.75}
    # b: no call counts 0; its fact recall is one rollout's only, so it has none
    assert values["b"]["tool_success"] == 0.5 and "fact_recall" not in values["b"]


def test_paired_change_against_hand_computed_intervals():
    before, after = instance_values(BASE), instance_values(SFT)
    # accuracy per instance 0, 0, 0, 0.5 -> 0.5, 0.5, 1, 0.5: changes 0.5, 0.5, 1, 0; mean 0.5,
    # sample variance (0 + 0 + 0.25 + 0.25) / 3 = 1/6, half width t(3) * sqrt(1/6 / 4)
    accuracy = paired_change(before, after, "accuracy")
    assert accuracy["mean"] == pytest.approx(0.5) and accuracy["n"] == 4
    assert accuracy["half_width"] == pytest.approx(T3 * math.sqrt(1 / 24), rel=1e-6)
    assert accuracy["low"] == pytest.approx(0.5 - T3 * math.sqrt(1 / 24), rel=1e-6)
    # tool success 0 (no call), 0, 0.5, 1 -> 1, 1, 1, 1: changes 1, 1, 0.5, 0; mean 0.625,
    # variance (0.140625 * 2 + 0.015625 + 0.390625) / 3
    tools = paired_change(before, after, "tool_success")
    assert tools["mean"] == pytest.approx(0.625)
    assert tools["half_width"] == pytest.approx(T3 * math.sqrt(0.6875 / 3 / 4), rel=1e-6)
    # memory 0, 0, 4, 8 -> 10, 10, 12, 8: changes 10, 10, 8, 0; mean 7, variance (9 + 9 + 1 + 49) / 3
    memory = paired_change(before, after, "memory_tokens")
    assert memory["mean"] == pytest.approx(7.0)
    assert memory["half_width"] == pytest.approx(T3 * math.sqrt(68 / 3 / 4), rel=1e-6)
    # only shared instances pair; one gives its change without an interval; none gives nothing
    one = paired_change(before, {"synth": {"a": after["synth"]["a"]}}, "accuracy")
    assert one == {"mean": 0.5, "half_width": None, "low": None, "high": None, "n": 1}
    assert paired_change(before, {"other": after["synth"]}, "accuracy") is None
    assert paired_change(before, after, "fact_recall") is None  # no instance knows its facts


def test_change_rows_per_source_and_per_question_category():
    before = [*BASE[:2], record("x", [1, 0, 1], source="locomo", categories=[1, 1, 2]),
              record("y", [0, 0], source="locomo", categories=[1, 2])]
    after = [*SFT[:2], record("x", [1, 1, 0], source="locomo", categories=[1, 1, 2]),
             record("y", [1, 1], source="locomo", categories=[1, 2])]
    assert category_accuracy(before) == {"locomo": {"1": {"x": 0.5, "y": 0.0}, "2": {"x": 1.0, "y": 0.0}}}
    rows = change_rows(before, after)
    assert [(r["source"], r["category"], r["instances"]) for r in rows] == [
        ("all", None, 4), ("locomo", None, 2), ("locomo", "1", 2), ("locomo", "2", 2), ("synth", None, 2)]
    # locomo accuracy x 2/3 -> 2/3, y 0 -> 1: changes 0 and 1, mean 0.5, half width t(1) * sqrt(0.5 / 2)
    locomo = rows[1]["accuracy"]
    assert locomo["mean"] == pytest.approx(0.5) and locomo["half_width"] == pytest.approx(T1 * 0.5, rel=1e-6)
    # category 1: x 0.5 -> 1, y 0 -> 1: changes 0.5, 1; category 2: x 1 -> 0, y 0 -> 1: changes -1, 1
    assert rows[2]["accuracy"]["mean"] == pytest.approx(0.75)
    assert rows[2]["accuracy"]["half_width"] == pytest.approx(T1 * math.sqrt(0.125 / 2), rel=1e-6)
    assert rows[3]["accuracy"]["mean"] == pytest.approx(0.0) and rows[3]["tool_success"] is None
    # all: synth a, b (changes 0.5, 0.5) and locomo x, y (0, 1) in source order: mean 0.5
    assert rows[0]["accuracy"]["mean"] == pytest.approx(0.5) and rows[0]["accuracy"]["n"] == 4
    assert rows[4]["memory_tokens"]["mean"] == pytest.approx(10.0)
    left = change_rows(before, after, left_out=("mean_reward",))
    assert all(row["mean_reward"] is None for row in left) and left[0]["accuracy"] == rows[0]["accuracy"]


def test_compare_prints_both_tables_and_writes_them(tmp_path, capsys):
    a = write(tmp_path / "base" / "validation.json", report(BASE))
    write(tmp_path / "sft" / "validation_step2.json", report([]))  # an earlier step: not the one read
    b = write(tmp_path / "sft" / "validation_step10.json", report(SFT))
    out = tmp_path / "compare.json"
    run(["compare", str(tmp_path / "base"), str(tmp_path / "sft"), "--out", str(out)])
    printed = capsys.readouterr().out
    assert f"A  {a}" in printed and f"B  {b}" in printed
    assert "B - A: mean change per instance [95 % t interval]" in printed
    half = T3 * math.sqrt(1 / 24)
    assert f"+0.500 [{0.5 - half:+.2f}, {0.5 + half:+.2f}]" in printed
    assert "+7.0 [" in printed  # memory tokens, one decimal
    written = json.loads(out.read_text())
    assert [r["label"] for r in written["reports"]] == ["A", "B"] and written["reports"][0]["path"] == a
    assert written["changes"][0]["before"] == "A" and written["notes"] == []
    assert written["changes"][0]["rows"][0]["accuracy"]["half_width"] == pytest.approx(half, rel=1e-6)
    assert format_result(written) == printed.split("\n\n(written to")[0]


def test_a_chain_of_reports_compares_each_with_the_one_before(tmp_path, capsys):
    stages = (("base", BASE), ("sft", SFT), ("again", SFT))
    paths = [write(tmp_path / f"{name}.json", report(records)) for name, records in stages]
    run(["compare", *paths, "--labels", "base,sft,again"])
    printed = capsys.readouterr().out
    assert "sft - base:" in printed and "again - sft:" in printed
    assert "+0.000 [+0.00, +0.00]" in printed  # no change anywhere


def _one_line_error(args, capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        run(args)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    return err


OTHER_READER = scoring_settings(
    "tiny", ReaderSettings(kind="extractive"), RewardSettings(), load_templates(None)
)


@pytest.mark.parametrize(("after", "message"), [
    (report(SFT[:3]), "they hold different instances: 1 only in {a} (first synth/d)"),
    (report([*SFT[:3], record("e", [1, 0])]), "1 only in {a} (first synth/d), 1 only in {b} (first synth/e)"),
    (report([*SFT[:3], {**SFT[3], "chunk_tokens": 90}]), "instance synth/d reads other chunks (100 vs 90"),
    (report([*SFT[:3], {**SFT[3], "questions": SFT[3]["questions"][:1]}]), "instance synth/d is asked other"),
    (report(SFT, OTHER_READER),
     "scored with other settings: model.reader.kind 'local' vs 'extractive' and 3 more"),
    (report(SFT, invalid="3 of 8 answers failed"), "{b}: marked invalid, not a score: 3 of 8 answers failed"),
])
def test_reports_that_cannot_be_compared_are_refused_in_one_line(after, message, tmp_path, capsys):
    a, b = write(tmp_path / "a.json", report(BASE)), write(tmp_path / "b.json", after)
    out = tmp_path / "out.json"
    err = _one_line_error(["compare", a, b, "--out", str(out)], capsys)
    assert message.format(a=a, b=b) in err and err.startswith("memalpha compare: error: ")
    assert not out.exists()


def test_bad_arguments_and_files_are_one_line(tmp_path, capsys):
    a = write(tmp_path / "a.json", report(BASE))
    assert "needs two reports or more, got 1" in _one_line_error(["compare", a], capsys)
    assert "--labels needs 2 different non-empty names, got 'x,x'" in _one_line_error(
        ["compare", a, a, "--labels", "x,x"], capsys)
    (tmp_path / "text.json").write_text("not json")
    assert "text.json: not JSON" in _one_line_error(["compare", a, str(tmp_path / "text.json")], capsys)
    broken = write(tmp_path / "broken.json", report([{**BASE[0], "memory_tokens": "many"}]))
    assert f"{broken}: record 0: field 'memory_tokens' missing or not a number" in _one_line_error(
        ["compare", a, broken], capsys)
    listed = write(tmp_path / "l.json", [1])
    assert "not a validation report" in _one_line_error(["compare", a, listed], capsys)
    (tmp_path / "empty").mkdir()
    assert "no validation.json or validation_step*.json" in _one_line_error(
        ["compare", a, str(tmp_path / "empty")], capsys)
    write(tmp_path / "both" / "validation.json", report(BASE))
    write(tmp_path / "both" / "validation_step1.json", report(BASE))
    assert "holds validation.json and validation_step*.json" in _one_line_error(
        ["compare", a, str(tmp_path / "both")], capsys)
    assert "unrecognized arguments: --frob" in _one_line_error(["compare", a, a, "--frob"], capsys)


def test_other_reward_settings_leave_mean_reward_out_and_say_so(tmp_path, capsys):
    heavier = scoring_settings("tiny", ReaderSettings(), RewardSettings(beta=0.1), load_templates(None))
    a, b = write(tmp_path / "a.json", report(BASE)), write(tmp_path / "b.json", report(SFT, heavier))
    out = tmp_path / "out.json"
    run(["compare", a, b, "--out", str(out)])
    written = json.loads(out.read_text())
    assert all(row["mean_reward"] is None for row in written["changes"][0]["rows"])
    assert written["changes"][0]["rows"][0]["accuracy"]["mean"] == pytest.approx(0.5)
    note = f"mean_reward of {b} - {a} left out: other reward settings (model.reward.beta 0.05 vs 0.1)"
    assert written["notes"] == [note]
    assert "note: mean_reward of" in capsys.readouterr().out


def test_reports_without_settings_are_compared_on_their_instances_with_a_note(tmp_path, capsys):
    a, b = write(tmp_path / "a.json", report(BASE, None)), write(tmp_path / "b.json", report(SFT))
    run(["compare", a, b])
    assert f"note: A ({a}) records no scoring settings" in capsys.readouterr().out
    c = write(tmp_path / "c.json", report(SFT[:3], None))
    assert "they hold different instances" in _one_line_error(["compare", a, c], capsys)


def test_scoring_settings_name_what_measures_a_report():
    templates = load_templates(None)
    local = SETTINGS["scoring"]
    assert local["model.reader.model"] == "tiny" and local["model.reader.max_new_tokens"] == 64
    assert OTHER_READER["scoring"]["model.reader.model"] is None
    assert OTHER_READER["scoring"]["model.reader.temperature"] is None
    remote = scoring_settings("tiny", ReaderSettings(kind="openai", openai=OpenAISettings(model="big")),
                              RewardSettings(), templates)
    assert remote["scoring"]["model.reader.model"] == "big"
    # the reader's prompt texts count, the memorising ones do not
    reworded = scoring_settings("tiny", ReaderSettings(), RewardSettings(),
                                replace(templates, answer_user="Q: {instruction} {question}"))
    assert reworded["scoring"] != local
    assert scoring_settings("tiny", ReaderSettings(), RewardSettings(),
                            replace(templates, memorise_user="{chunk}{limit_note}"))["scoring"] == local
    official = scoring_settings("tiny", ReaderSettings(), RewardSettings(metric_style="official"), templates)
    assert official["scoring"]["model.reward.metric_style"] == "official"
    assert "model.rollout.prompt_templates[content_judge]" not in SETTINGS["reward"]
    judged = scoring_settings("tiny", ReaderSettings(), RewardSettings(content_judge="llm"), templates)
    assert "model.rollout.prompt_templates[content_judge]" in judged["reward"]
    json.dumps(judged)  # it goes into the report as it is
