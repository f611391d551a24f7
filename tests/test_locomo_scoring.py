"""LoCoMo's answer metric (memalpha/agent/locomo_metrics.py) against hand-computed numbers, through
the source registry in both answer styles, and its per-category table in the validation report."""

from __future__ import annotations

import json
import math

import pytest

from memalpha.agent.answer_metrics import MEMALPHA_ANSWERS, OFFICIAL_ANSWERS, metric_for_source, score_answers
from memalpha.agent.locomo_metrics import (
    bleu1,
    chosen_option,
    chosen_option_official,
    locomo_f1,
    locomo_recall,
    locomo_tokens,
    multi_hop_f1,
    token_f1,
    token_recall,
)
from memalpha.agent.rollout import RolloutRecord
from memalpha.data.locomo import NOT_MENTIONED
from memalpha.train.validation_report import format_locomo_table, summarise_records, write_validation_report

MULTI_HOP, TEMPORAL, OPEN_DOMAIN, SINGLE_HOP, ADVERSARIAL = 1, 2, 3, 4, 5
FIRST = {"category": ADVERSARIAL, "options": {"a": NOT_MENTIONED, "b": "Miso"}}  # "not mentioned" is (a)
SECOND = {"category": ADVERSARIAL, "options": {"a": "Miso", "b": NOT_MENTIONED}}  # ... is (b)


def test_tokens_drop_commas_punctuation_articles_and_and_then_stem():
    assert locomo_tokens("The cats, 1,000 and a dog's agencies!") == ["cat", "1000", "dog", "agenc"]
    assert locomo_tokens("Likely yes; he plays") == ["like", "ye", "he", "play"]


def test_token_f1_counts_stems_as_the_same_word():
    # she research adopt agenc / research adopt agenc: 3 shared, P 3/4, R 1
    answer, gold = "She researched adoption agencies", "researching adoption agencies"
    assert token_f1(answer, gold) == pytest.approx(6 / 7)
    assert token_f1("the cello and piano", "cello") == pytest.approx(2 / 3)  # P 1/2, R 1
    assert token_f1("violin", "cello") == 0.0
    assert token_f1("", "cello") == 0.0 and token_f1("the", "the") == 0.0  # nothing left to share
    # recall: the gold's stems found, whatever else the answer says
    assert token_recall(answer, gold) == 1.0
    assert token_recall("the cello", "cello and piano") == pytest.approx(1 / 2)


def test_multi_hop_scores_each_comma_separated_sub_answer_against_the_best_part_of_the_prediction():
    gold = "a green vase, a mug"
    assert multi_hop_f1("mug, green vase", gold) == 1.0  # each sub-answer matches one part
    assert multi_hop_f1("green vase", gold) == pytest.approx(1 / 2)  # vase 1, mug 0
    # no comma in the prediction: one part, "i made green vase mug" against each sub-answer:
    # green vase P 2/5 R 1 -> 4/7; mug P 1/5 R 1 -> 1/3
    assert multi_hop_f1("I made a green vase and a mug", gold) == pytest.approx((4 / 7 + 1 / 3) / 2)
    assert token_f1("I made a green vase and a mug", gold) == pytest.approx(3 / 4)  # unsplit: P 3/5, R 1
    meta = {"category": MULTI_HOP}
    assert locomo_f1("I made a green vase and a mug", gold, meta) == pytest.approx(19 / 42)
    assert locomo_recall("I made a green vase and a mug", gold, meta) == 1.0
    assert locomo_recall("green vase", gold, meta) == pytest.approx(1 / 2)


def test_open_domain_keeps_the_gold_before_its_first_semicolon():
    gold = "Likely yes; he plays the cello"
    meta = {"category": OPEN_DOMAIN}
    assert locomo_f1("yes", gold, meta) == pytest.approx(2 / 3)  # [ye] against [like, ye]
    assert token_f1("yes", gold) == pytest.approx(1 / 3)  # against all five tokens
    assert locomo_recall("yes", gold, meta) == pytest.approx(1 / 2)
    # the other categories score the whole gold
    assert locomo_f1("yes", gold, {"category": SINGLE_HOP}) == pytest.approx(1 / 3)
    assert locomo_f1("March 2 2024", "2 March 2024", {"category": TEMPORAL}) == 1.0


def test_adversarial_scores_an_answer_that_says_the_information_is_not_there():
    for meta in (FIRST, SECOND):
        assert locomo_f1("It is not mentioned anywhere.", "", meta) == 1.0
        assert locomo_f1("No information available", "", meta) == 1.0
        assert locomo_f1("Miso", "", meta) == 0.0
        assert locomo_f1("I don't know", "", meta) == 0.0  # not one of the two phrases
    # a reply that is only a letter is read as its option
    assert [locomo_f1(r, "", FIRST) for r in ("a", "(a)", "b", "(b)")] == [1.0, 1.0, 0.0, 0.0]
    assert [locomo_f1(r, "", SECOND) for r in ("a", "(a)", "b", "(b)")] == [0.0, 0.0, 1.0, 1.0]
    # LoCoMo reads any one character but "a" as b, any three but "(a)" as b: "No." picks option b
    assert chosen_option_official("No.", FIRST["options"]) == "Miso"
    assert locomo_f1("No.", "", SECOND) == 1.0 and locomo_recall("No.", "", SECOND) == 0.0
    # memalpha reads only a letter as a letter
    assert chosen_option(" (B). ".strip(), SECOND["options"]) == NOT_MENTIONED
    assert chosen_option("b:", FIRST["options"]) == "Miso"


def test_the_locomo_source_scores_by_category_in_both_styles():
    assert metric_for_source("locomo") == "locomo"
    predictions = ["She researched adoption agencies", "(b)", "<think>hm</think>yes"]
    golds = ["researching adoption agencies", NOT_MENTIONED, "Likely yes; maybe"]
    metadata = [{"category": SINGLE_HOP}, SECOND, {"category": OPEN_DOMAIN}]
    official, _ = score_answers("locomo", predictions, golds, metadata=metadata, style=OFFICIAL_ANSWERS)
    ours, _ = score_answers("locomo", predictions, golds, metadata=metadata, style=MEMALPHA_ANSWERS)
    assert official == pytest.approx([6 / 7, 1.0, 2 / 3])
    assert ours == pytest.approx([1.0, 1.0, 1 / 2])
    failed, _ = score_answers("locomo", predictions, golds, metadata=metadata, ok=[False, True, True])
    assert failed[0] == 0.0


def test_a_locomo_question_without_its_category_is_refused_naming_the_metric():
    with pytest.raises(ValueError, match="metric 'locomo' scores each question by its LoCoMo category"):
        score_answers("locomo", ["x"], ["y"])
    with pytest.raises(ValueError, match="an adversarial question needs its two options"):
        score_answers("locomo", ["x"], [NOT_MENTIONED], metadata=[{"category": ADVERSARIAL}])


def question(category: int, prediction: str, gold: str, score: float, **extra) -> dict:
    return {
        "question": "q", "gold": gold, "prediction": prediction, "score": score, "error": None,
        "metadata": {"category": category, **extra},
    }  # fmt: skip


def test_bleu1_is_the_clipped_unigram_precision_times_the_brevity_penalty():
    assert bleu1("she moved to Paris", "Paris") == pytest.approx(1 / 4)  # longer than the gold: no penalty
    assert bleu1("Paris", "in Paris, France") == pytest.approx(math.exp(1 - 4 / 1))  # 4 gold tokens
    assert bleu1("paris paris paris", "Paris") == pytest.approx(1 / 3)  # a match counts once
    assert bleu1("I went. She came.", "she came") == pytest.approx(2 / 6)  # each sentence's period a token
    assert bleu1("no", "yes") == 0.0 and bleu1("", "yes") == 0.0 and bleu1("yes", "") == 0.0


def records() -> list[RolloutRecord]:
    questions = [
        # F1 6/7; BLEU-1: 2 of its 4 words in the gold, longer than it: 1/2
        question(SINGLE_HOP, "She researched adoption agencies", "researching adoption agencies", 1.0),
        question(SINGLE_HOP, "violin", "cello", 0.0),  # F1 0, BLEU-1 0
        # F1 1/2; BLEU-1: both words in the gold (6 tokens, its comma one): 1 * exp(1 - 6/2)
        question(MULTI_HOP, "green vase", "a green vase, a mug", 0.5),
        question(ADVERSARIAL, "(b)", NOT_MENTIONED, 1.0, options=SECOND["options"]),  # F1 1
    ]
    return [
        RolloutRecord("fx-1", "locomo", 0, [], {}, 0, 10, questions),
        RolloutRecord("other", "squad", 0, [], {}, 0, 10, [{"score": 1.0, "error": None}]),
    ]


def test_the_validation_report_gives_each_locomo_category_both_scores(tmp_path):
    summary = summarise_records(records())
    categories = summary["per_source"]["locomo"]["per_category"]
    assert list(categories) == ["single-hop", "multi-hop", "adversarial", "all", "all_but_adversarial"]
    assert categories["single-hop"] == {
        "category": 4, "questions": 2, "accuracy": 0.5, "locomo_f1": pytest.approx(3 / 7),
        "locomo_bleu1": pytest.approx(0.25),
    }  # fmt: skip
    assert categories["multi-hop"]["locomo_bleu1"] == pytest.approx(math.exp(-2))
    assert categories["adversarial"]["locomo_bleu1"] is None and categories["all"]["locomo_bleu1"] is None
    assert categories["multi-hop"]["locomo_f1"] == pytest.approx(1 / 2)
    assert categories["all"]["locomo_f1"] == pytest.approx((6 / 7 + 0 + 1 / 2 + 1) / 4)
    assert categories["all"]["accuracy"] == pytest.approx(2.5 / 4)
    assert categories["all_but_adversarial"] == {
        "category": [4, 1], "questions": 3, "accuracy": 0.5, "locomo_f1": pytest.approx((6 / 7 + 1 / 2) / 3),
        "locomo_bleu1": pytest.approx((1 / 2 + math.exp(-2)) / 3),
    }  # fmt: skip
    assert "per_category" not in summary["per_source"]["squad"]
    lines = format_locomo_table(summary).splitlines()
    assert lines[1] == (
        "LoCoMo per category (accuracy: the metric in force; locomo_f1: LoCoMo's own score; bleu1: the "
        "papers' BLEU-1, adversarial questions left out)"
    )
    assert lines[2].split() == ["locomo", "category", "questions", "accuracy", "locomo_f1", "bleu1"]
    assert lines[4].split() == ["single-hop", "(4)", "2", "0.500", "0.429", "0.250"]
    assert lines[-2].split() == ["all", "4", "0.625", "0.589", "-"]
    assert lines[-1].split() == ["all_but_adversarial", "3", "0.500", "0.452", "0.212"]
    # the printed table ends with it, and the JSON has each LoCoMo question's score and category
    table = write_validation_report(summary, records(), tmp_path / "validation.json")
    assert "multi-hop (1)" in table
    written = json.loads((tmp_path / "validation.json").read_text())
    first = written["records"][0]["questions"]
    assert [q["metadata"]["category"] for q in first] == [4, 4, 1, 5]
    assert [q["locomo_f1"] for q in first] == pytest.approx([6 / 7, 0.0, 1 / 2, 1.0])
    assert "locomo_f1" not in written["records"][1]["questions"][0]
    assert written["summary"]["per_source"]["locomo"]["per_category"]["adversarial"]["questions"] == 1


def test_a_report_without_locomo_questions_prints_no_category_table():
    summary = summarise_records(records()[1:])
    assert format_locomo_table(summary) == "" and "per_category" not in summary["per_source"]["squad"]
