"""The learning-curve statistics (``experiments/lab/memalpha_lab/stats.py``,
``experiments/lab/memalpha_lab/across_seeds.py``) against hand-computed values, and the committed
``experiments/results/learning_curve_seeds.json`` rebuilt from its committed inputs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from memalpha_lab.across_seeds import combine
from memalpha_lab.instance_scores import study_instance_values
from memalpha_lab.stats import mean_ci, paired_difference, summarise_with_ci, t975


def record(instance, source, scores, statuses, rewards, memory_tokens=10, r3=0.5):
    return {
        "instance_id": instance,
        "data_source": source,
        "questions": [{"score": s} for s in scores],
        "turns": [
            {"results": [{"status": st} for st in turn], "reward": r} for turn, r in zip(statuses, rewards)
        ],
        "memory_tokens": memory_tokens,
        "r3": r3,
    }


def test_mean_ci_matches_a_hand_computed_t_interval():
    # values 1, 2, 3, 6: mean 3, sample variance (4 + 1 + 0 + 9) / 3 = 14/3, t(3) = 3.18245
    ci = mean_ci([1.0, 2.0, 3.0, 6.0])
    assert ci["mean"] == 3.0
    assert ci["n"] == 4
    assert math.isclose(ci["half_width"], 3.18245 * math.sqrt((14 / 3) / 4), rel_tol=1e-5)


def test_mean_ci_of_one_value_has_no_width_and_of_none_is_an_error():
    assert mean_ci([0.25]) == {"mean": 0.25, "half_width": 0.0, "n": 1}
    with pytest.raises(ValueError):
        mean_ci([])


def test_t_quantiles_fall_towards_the_normal_value():
    assert t975(1) == pytest.approx(12.706, abs=1e-3) and t975(30) == pytest.approx(2.042, abs=1e-3)
    assert t975(35) < t975(30) and t975(45) < t975(35)
    assert t975(10_000) == pytest.approx(1.960, abs=1e-3)
    with pytest.raises(ValueError):
        t975(0)


def test_instance_values_average_questions_calls_turns_and_rollouts():
    records = [
        # instance a, two rollouts: accuracy 1/2 and 1/2; tool success 2/3 and 1/1; reward 1.5 and 0.5
        record("a", "s1", [1, 0], [["ok", "error"], ["ok"]], [1.0, 2.0], memory_tokens=10),
        record("a", "s1", [0, 1], [["skipped"], []], [0.0, 1.0], memory_tokens=20),
        # instance b: no call at all counts as tool success 0
        record("b", "s2", [1], [[]], [0.05], r3=1.0),
    ]
    values = study_instance_values(records)
    a = values["s1"]["a"]
    assert a["accuracy"] == 0.5
    assert math.isclose(a["tool_success"], (2 / 3 + 1) / 2)
    assert a["mean_reward"] == 1.0
    assert a["memory_tokens"] == 15.0
    assert values["s2"]["b"] == {
        "accuracy": 1.0, "tool_success": 0.0, "memory_tokens": 10.0, "compression": 1.0, "mean_reward": 0.05,
    }
    summary = summarise_with_ci(values)
    assert set(summary) == {"s1", "s2", "all"}
    assert summary["all"]["accuracy"]["mean"] == 0.75 and summary["all"]["accuracy"]["n"] == 2


def test_answer_stored_and_reader_given_stored_separate_the_memory_from_the_reader():
    memory = {"core": "", "semantic": [{"id": "a1", "content": "Viveka Brandvold moved to Dunedin."}],
              "episodic": [{"id": "b2", "content": "On 2024-01-02 Anselm began Finnish classes."}]}

    def qa(source, golds_scores, with_memory=True):
        rec = record("i", source, [score for _, score in golds_scores], [["ok"]], [1.0])
        for question, (gold, _) in zip(rec["questions"], golds_scores):
            question["gold"] = gold
        if with_memory:
            rec["memory"] = memory
        return rec

    # golds Dunedin (stored, read right), Finnish (stored, read wrong), pho (not stored, guessed right)
    values = study_instance_values(
        [qa("synth_personal", [("Dunedin", 1), ("finnish", 0), ("pho", 1)])]
    )["synth_personal"]["i"]
    assert values["answer_stored"] == 2 / 3 and values["reader_given_stored"] == 1 / 2
    assert values["accuracy"] == 2 / 3
    # nothing stored: no reader_given_stored; a second rollout without a memory drops answer_stored too
    assert (
        "reader_given_stored"
        not in study_instance_values([qa("synth_personal", [("pho", 1)])])["synth_personal"]["i"]
    )
    two = study_instance_values(
        [qa("synth_personal", [("Dunedin", 1)]), qa("synth_personal", [("Dunedin", 0)], False)]
    )
    assert "answer_stored" not in two["synth_personal"]["i"]
    # a boxed label cannot be read off a memory text
    assert "answer_stored" not in study_instance_values([qa("synth_icl", [("2", 1)])])["synth_icl"]["i"]


def test_paired_difference_uses_only_shared_instances():
    before = {"s": {"a": {"mean_reward": 1.0}, "b": {"mean_reward": 2.0}, "c": {"mean_reward": 0.0}}}
    after = {"s": {"a": {"mean_reward": 2.0}, "b": {"mean_reward": 4.0}}}
    diff = paired_difference(before, after, "mean_reward")
    # differences 1 and 2: mean 1.5, sd sqrt(0.5), t(1) = 12.706
    assert diff["mean"] == 1.5 and diff["n"] == 2
    assert math.isclose(diff["half_width"], 12.7062 * math.sqrt(0.5 / 2), rel_tol=1e-5)
    with pytest.raises(ValueError):
        paired_difference(before, {"t": {"z": {"mean_reward": 0.0}}}, "mean_reward")


def _seed_report(seeds_and_gains, **settings):
    """A learning_curve.py report whose every metric changed by the seed's gain ± 0.1."""

    def change(gain):
        return {m: {"mean": gain, "half_width": 0.1, "n": 48} for m in
                ("accuracy", "tool_success", "memory_tokens", "compression", "mean_reward")}

    return {
        "settings": {"steps": 20, "val_instances": 48, "seeds": [s for s, _ in seeds_and_gains], **settings},
        "seeds": [{"seed": s, "change_last_minus_start": change(g)} for s, g in seeds_and_gains],
    }


REPO = Path(__file__).resolve().parent.parent


def test_learning_curve_seeds_combines_per_seed_changes_with_a_t_interval_over_seeds(tmp_path):
    reports = {"a": _seed_report([(0, 0.05)]), "b": _seed_report([(1, 0.20), (2, 0.35)])}
    result = combine(reports)
    across = result["across_seeds"]["mean_reward"]
    # gains 0.05, 0.20, 0.35: mean 0.20, sd 0.15, half width t(2) * 0.15 / sqrt(3) = 4.303 * 0.0866
    assert across["n"] == 3 and across["mean"] == pytest.approx(0.20)
    assert across["half_width"] == pytest.approx(4.303 * 0.15 / math.sqrt(3), rel=1e-3)
    assert result["seeds_rising_beyond_own_interval"]["mean_reward"] == 2  # 0.20 and 0.35 exceed their 0.1
    with pytest.raises(ValueError, match="steps"):
        combine({"a": _seed_report([(0, 0.1)]), "b": _seed_report([(1, 0.1)], steps=40)})
    with pytest.raises(ValueError, match="seed appears twice"):
        combine({"a": _seed_report([(0, 0.1)]), "b": _seed_report([(0, 0.2)])})
    with pytest.raises(ValueError, match="b: not a learning_curve.py report"):
        combine({"a": _seed_report([(0, 0.1)]), "b": {"settings": reports["a"]["settings"]}})


def test_the_committed_learning_curve_seeds_report_is_rebuilt_from_its_committed_inputs():
    from memalpha_lab.control_arms_report import same_numbers

    committed = json.loads((REPO / "experiments" / "results" / "learning_curve_seeds.json").read_text())
    reports = {where: json.loads((REPO / where).read_text()) for where in committed["inputs"]}
    rebuilt = combine(reports)
    assert same_numbers(rebuilt, {key: committed[key] for key in rebuilt})
    assert committed["across_seeds"]["mean_reward"]["n"] == 3  # already an interval over seeds (t, 2 df)


def test_instance_values_average_fact_recall_only_where_every_rollout_has_one():
    known = [dict(record("a", "s", [1], [["ok"]], [1.0]), fact_recall=0.5),
             dict(record("a", "s", [1], [["ok"]], [1.0]), fact_recall=1.0)]
    partly = [dict(record("b", "s", [1], [["ok"]], [1.0]), fact_recall=1.0),
              dict(record("b", "s", [1], [["ok"]], [1.0]), fact_recall=None)]
    values = study_instance_values(known + partly)["s"]
    assert values["a"]["fact_recall"] == 0.75
    assert "fact_recall" not in values["b"]
