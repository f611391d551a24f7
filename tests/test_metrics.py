"""Per-source metrics: hand-checked cases for every metric, the source registry, and the
official PubMed-RCT scores reproduced from the recorded Mem-alpha-4B run."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from memalpha.agent import answer_metrics as scoring
from memalpha.agent.answer_metrics import (
    boxed_label_match,
    keyword_hit,
    metric_for_source,
    multi_part_match,
    normalize_answer,
    parse_yes_no,
    score_answer,
    score_answers,
    substring_match,
)
from memalpha.reader.base import Reader, ReaderAnswer
from memalpha.reader.options import RetrievalSettings

PUBMED_RESULTS = Path(__file__).resolve().parent / "fixtures" / "memalpha4b_pubmed" / "reader_results.jsonl"


@pytest.mark.parametrize(
    ("prediction", "gold", "expected"),
    [
        ("The capital is Paris.", "paris", 1.0),
        ("It was THE Beatles!", "Beatles", 1.0),  # case and punctuation
        ("an apple a day", "The apple", 1.0),  # articles dropped on both sides
        ("U.S.A. it is", "USA", 1.0),  # punctuation inside the gold
        ("", "Paris", 0.0),  # empty prediction
        ("Par is", "Paris", 0.0),
        ("Berlin, of course", ["Paris", "Berlin"], 1.0),  # max over golds
        ("<think>Paris?</think> London", "Paris", 0.0),  # thinking is not the answer
        ("<think>it is Paris", "Paris", 0.0),  # unfinished thinking leaves nothing
    ],
)
def test_substring_match(prediction, gold, expected):
    assert substring_match(prediction, gold) == expected


@pytest.mark.parametrize(
    ("prediction", "gold", "expected"),
    [
        ("Alice and Bob", "Alice; Bob", 1.0),
        ("alice only", "Alice; Bob", 0.5),
        ("nobody", "Alice; Bob; Carol", 0.0),
        ("Bob, Carol.", "Alice; Bob; Carol", 2 / 3),
        ("ALICE", "alice", 1.0),  # no ';' is a single part
        ("", "Alice; Bob", 0.0),
        ("Bob", "Alice; ;Bob;", 0.5),  # empty parts are not parts
    ],
)
def test_multi_part_match(prediction, gold, expected):
    assert multi_part_match(prediction, gold) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("prediction", "gold", "expected"),
    [
        ("so the label is \\boxed{3}", "3", 1.0),
        ("\\boxed{ 3 }", "3", 1.0),  # spaces inside the box
        ("\\boxed{2} or maybe \\boxed{3}", "3", 0.0),  # only the first box counts
        ("\\boxed{2} or maybe \\boxed{3}", "2", 1.0),
        ("\\boxed{'4'}", "4", 1.0),  # quotes stripped
        ("\\boxed{03}", "3", 0.0),  # exact label, not numeric value
        ("\\boxed{-1}", "2", 0.0),
        ("<answer>4</answer> \\boxed{3}", "4", 1.0),  # answer tag wins
        ("3", "3", 1.0),  # no box: the whole reply is the label (official)
        ("The answer is 3", "3", 0.0),
        ("", "3", 0.0),  # empty prediction
        ("\\boxed{sports}", "sports", 1.0),  # text labels (synthetic ICL)
        ("\\boxed{Sports}", "sports", 0.0),
    ],
)
def test_boxed_label_match(prediction, gold, expected):
    assert boxed_label_match(prediction, gold) == expected


@pytest.mark.parametrize(
    ("prediction", "gold", "expected"),
    [
        ("Elizabeth meets Darcy at Pemberley", "Elizabeth, Darcy, Pemberley", 1.0),
        ("a trip to   New\nYork", "new york, Paris", 0.5),  # keyword with a space
        ("ELIZABETH", " elizabeth , darcy ", 0.5),
        ("newyork", "new york", 0.0),  # a multi-word keyword must appear whole
        ("", "alpha, beta", 0.0),  # empty prediction
        ("alpha and beta", ["alpha", "beta"], 1.0),  # a list gold is the keyword list
        ("alpha", "alpha, , beta,", 0.5),  # empty keywords ignored
    ],
)
def test_keyword_hit(prediction, gold, expected):
    assert keyword_hit(prediction, gold) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("Yes", 1.0),
        ("yes.", 1.0),
        ("No", 0.0),
        ("Yes and no", 0.0),  # both: not a yes
        ("I know it, yes", 1.0),  # 'no' inside 'know' is not a no
        ("", 0.0),
        ("<think>no?</think>Yes", 1.0),
    ],
)
def test_parse_yes_no(reply, expected):
    assert parse_yes_no(reply) == expected


def test_normalize_answer():
    assert normalize_answer("  The  Quick, brown fox! ") == "quick brown fox"
    assert normalize_answer("An A-team") == "ateam"


class RubricReader(Reader):
    """A deterministic judge: says yes when the rubric line's text appears in the response line.

    It is a complete Reader (its own backend), used to test the judge plumbing without an LLM.
    """

    def __init__(self, fail_on: str | None = None):
        super().__init__(retrieval=RetrievalSettings(top_k_entries=5, prompt_tokens=10_000))
        self.fail_on = fail_on
        self.seen: list[str] = []

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def chat(self, conversations):
        answers = []
        for conv in conversations:
            prompt = conv[-1]["content"]
            self.seen.append(prompt)
            if self.fail_on and self.fail_on in prompt:
                answers.append(ReaderAnswer(text="", ok=False, error="backend down"))
                continue
            rubric = prompt.split("Rubric:", 1)[1].split("\n", 1)[0].strip().lower()
            response = prompt.split("Response:", 1)[1].split("\n", 1)[0].strip().lower()
            answers.append(ReaderAnswer(text="yes" if rubric in response else "no", ok=True, error=None))
        return answers


def test_llm_judge_through_a_reader():
    judge = RubricReader(fail_on="FAILME")
    assert (
        score_answer("lme_train", "You like green tea.", "green tea", "What do I drink?", judge=judge) == 1.0
    )
    assert (
        score_answer("longmemeval_s", "You like coffee.", "green tea", "What do I drink?", judge=judge) == 0.0
    )
    assert score_answer("lme_train", "FAILME green tea", "green tea", "q", judge=judge) == 0.0
    assert "What do I drink?" in judge.seen[0]
    # batched: one judge call for all live answers; failed reader answers are not judged
    judge.seen.clear()
    scores, errors = score_answers(
        "lme_train",
        ["green tea", "coffee", "green tea"],
        ["green tea", "green tea", "green tea"],
        ["q1", "q2", "q3"],
        judge=judge,
        ok=[True, True, False],
    )
    assert scores == [1.0, 0.0, 0.0] and errors == [None, None, None]
    assert len(judge.seen) == 2
    with pytest.raises(ValueError, match="needs a judge"):
        score_answer("lme_train", "x", "y")


@pytest.mark.parametrize(
    ("source", "metric"),
    [
        ("squad", "substring"),
        ("hotpotqa", "substring"),
        ("perltqa", "multi_part"),
        ("pubmed-rct", "boxed"),
        ("booksum", "keyword"),
        ("lme_train", "llm_judge"),
        ("longmemeval_s_star", "llm_judge"),
        ("icl_banking77_5900shot_balance", "boxed"),
        ("ttl_train_trec_coarse", "boxed"),
        ("ruler_qa1_197K", "substring"),
        ("infbench_sum_eng_shots2", "keyword"),
        ("synth_personal", "substring"),
        ("synth_timeline", "substring"),
        ("synth_icl", "boxed"),
        ("synth_summary", "keyword"),
    ],
)
def test_default_source_mapping(source, metric):
    assert metric_for_source(source) == metric


def test_unknown_source_warns_once_and_overrides(caplog):
    scoring._warned_sources.discard("my_new_source")
    with caplog.at_level(logging.WARNING, logger="memalpha.agent.answer_metrics"):
        assert metric_for_source("my_new_source") == "substring"
        assert metric_for_source("my_new_source") == "substring"
    assert sum("my_new_source" in r.getMessage() for r in caplog.records) == 1
    assert metric_for_source("my_new_source", {"my_new_*": "keyword"}) == "keyword"
    assert metric_for_source("squad", {"squad": "multi_part"}) == "multi_part"
    assert score_answer("squad", "Alice", "Alice; Bob", overrides={"squad": "multi_part"}) == 0.5
    with pytest.raises(ValueError, match="unknown metrics"):
        metric_for_source("squad", {"squad": "rouge"})


def test_boxed_metric_reproduces_official_pubmed_scores():
    records = [json.loads(line) for line in PUBMED_RESULTS.read_text(encoding="utf-8").splitlines()]
    assert len(records) == 300
    assert {r["official_score"] for r in records} == {0.0, 1.0}
    for i, rec in enumerate(records):
        got = score_answer("pubmed-rct", rec["reader_response"], rec["answer"], rec["question"])
        assert got == rec["official_score"], f"{PUBMED_RESULTS} record {i}: {got} != {rec['official_score']}"
