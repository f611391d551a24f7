"""Per-source scoring of reader answers: one registry, chosen by an instance's ``data_source``.

Five metrics (docs/method.md: answering), each a pure function ``(prediction, gold) -> float in [0, 1]``
except the LLM judge, which asks a :class:`~memalpha.reader.base.Reader` a yes/no question:

==============  ==========================================================================
``substring``   the normalised gold is a substring of the normalised prediction
                (max over the golds when there are several)
``multi_part``  gold split on ``;``: the fraction of its parts found in the prediction
``boxed``       the label in the first ``\\boxed{...}`` (or ``<answer>...</answer>``)
                equals the gold label
``keyword``     gold split on ``,``: the fraction of keywords found in the prediction
``llm_judge``   the judge reads question, rubric and prediction and answers yes or no
==============  ==========================================================================

Normalisation (:func:`normalize_answer`) lower-cases, drops punctuation and the articles
*a/an/the*, and collapses white space, as the official MemoryAgentBench evaluation does.
A prediction's leading ``<think>...</think>`` block is removed before scoring; an
unfinished thinking block leaves nothing to score (the official code does the same).

Differences from the official training reward, all deliberate:

* ``substring`` normalises both sides (the official training reward for SQuAD/HotpotQA
  only lower-cases and checks the first gold; its evaluation normalises and takes the max).
* ``multi_part`` normalises each part and the prediction (the official code lower-cases
  the part but not the prediction, so a capitalised answer never matched).
* ``keyword`` lower-cases and collapses white space on both sides.
* ``boxed`` compares the extracted label with the gold label after stripping quotes and
  white space; for numeric gold labels (every official source) that is exactly the
  official digits-only rule, and it also works for our text labels.
"""

from __future__ import annotations

import fnmatch
import logging
import re
import string
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # only for annotations: the reader imports nothing from here
    from memalpha.reader.base import Reader

logger = logging.getLogger(__name__)

Gold = str | Sequence[str]

_PUNCTUATION = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_BOXED = re.compile(r"\\boxed\{([^}]*)\}")
_BOX = re.compile(r"\\box\{([^}]*)\}")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_WORD = re.compile(r"[a-z]+")


# ---------------------------------------------------------------------------
# text helpers
# ---------------------------------------------------------------------------


def normalize_answer(text: str) -> str:
    """Lower-case, drop punctuation and the articles a/an/the, collapse white space."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def strip_thinking(prediction: str) -> str:
    """The part of a reply after its ``</think>``; empty when a thinking block never closes."""
    if "</think>" in prediction:
        return prediction.split("</think>", 1)[1].strip()
    if "<think>" in prediction:
        return ""
    return prediction


def extract_label(prediction: str) -> str:
    """The answer label of a reply: ``<answer>`` tag, else first ``\\boxed{}``, else ``\\box{}``,
    else the whole reply; quotes and white space around it are removed."""
    for pattern in (_ANSWER_TAG, _BOXED, _BOX):
        match = pattern.search(prediction)
        if match:
            return match.group(1).strip().strip("\"'").strip()
    return prediction.strip().strip("\"'").strip()


def _golds(gold: Gold) -> list[str]:
    if isinstance(gold, str):
        return [gold]
    out: list[str] = []
    for item in gold:
        if isinstance(item, (list, tuple)):
            out.extend(str(x) for x in item)
        else:
            out.append(str(item))
    return out


def _contains(normalised_prediction: str, part: str) -> bool:
    needle = normalize_answer(part)
    if not needle:
        return not normalised_prediction
    return needle in normalised_prediction


# ---------------------------------------------------------------------------
# the rule metrics (pure)
# ---------------------------------------------------------------------------


def substring_match(prediction: str, gold: Gold) -> float:
    """1.0 when some normalised gold occurs inside the normalised prediction, else 0.0."""
    golds = _golds(gold)
    if not golds:
        return 0.0
    pred = normalize_answer(strip_thinking(prediction))
    return float(any(_contains(pred, g) for g in golds))


def multi_part_match(prediction: str, gold: Gold) -> float:
    """Fraction of the ``;``-separated gold parts found in the prediction (max over golds)."""
    pred = normalize_answer(strip_thinking(prediction))
    best = 0.0
    for single in _golds(gold):
        parts = [p for p in (x.strip() for x in single.split(";")) if p]
        if not parts:
            continue
        best = max(best, sum(_contains(pred, p) for p in parts) / len(parts))
    return best


def boxed_label_match(prediction: str, gold: Gold) -> float:
    """1.0 when the reply's first boxed label (see :func:`extract_label`) equals a gold label."""
    label = extract_label(strip_thinking(prediction))
    if not label:
        return 0.0
    return float(any(label == g.strip().strip("\"'").strip() for g in _golds(gold)))


def _keywords(gold: Gold) -> list[str]:
    if isinstance(gold, str):
        raw = gold.split(",")
    else:
        raw = [k for g in _golds(gold) for k in g.split(",")]
    return [" ".join(k.lower().split()) for k in raw if k.strip()]


def keyword_hit(prediction: str, gold: Gold) -> float:
    """Fraction of the gold's comma-separated keywords (or list items) found in the prediction.

    Matching is case-insensitive with white space collapsed; a multi-word keyword must
    appear as a whole.
    """
    keywords = _keywords(gold)
    if not keywords:
        return 0.0
    pred = " ".join(strip_thinking(prediction).lower().split())
    return sum(k in pred for k in keywords) / len(keywords)


def parse_yes_no(reply: str) -> float:
    """1.0 for a reply that says yes and not no (word-wise, after any thinking block), else 0.0."""
    words = set(_WORD.findall(strip_thinking(reply).lower()))
    return float("yes" in words and "no" not in words)


def _judge_prompt(question: str, gold: Gold, prediction: str) -> str:
    from memalpha.agent.prompts import answer_judge_prompt

    rubric = "; ".join(_golds(gold))
    return answer_judge_prompt(question=question, rubric=rubric, response=strip_thinking(prediction))


def llm_judge(prediction: str, gold: Gold, *, question: str = "", judge: Reader | None = None) -> float:
    """Ask ``judge`` whether the prediction satisfies the gold rubric; a failed call scores 0."""
    return llm_judge_many([prediction], [gold], [question], judge)[0]


def llm_judge_many(
    predictions: Sequence[str], golds: Sequence[Gold], questions: Sequence[str], judge: Reader | None
) -> list[float]:
    """:func:`llm_judge` for many answers in one batched call to the judge."""
    return _judge_many(predictions, golds, questions, judge)[0]


def _judge_many(
    predictions: Sequence[str], golds: Sequence[Gold], questions: Sequence[str], judge: Reader | None
) -> tuple[list[float], list[str | None]]:
    """The judged scores, and for each the error of its failed judge call (None when it was judged)."""
    if judge is None:
        raise ValueError(
            "metric 'llm_judge' needs a judge (a memalpha.reader.Reader); configure a reader "
            "or override the metric for this data_source"
        )
    prompts = [_judge_prompt(q, g, p) for p, g, q in zip(predictions, golds, questions, strict=True)]
    replies = judge.complete(prompts)
    scores = [parse_yes_no(r.text) if r.ok else 0.0 for r in replies]
    return scores, [None if r.ok else f"judge: {r.error}" for r in replies]



METRICS: dict[str, Callable[..., float]] = {
    "substring": substring_match,
    "multi_part": multi_part_match,
    "boxed": boxed_label_match,
    "keyword": keyword_hit,
    "llm_judge": llm_judge,
}
"""Metric name -> scoring function. All but ``llm_judge`` are pure ``(prediction, gold)``."""

# ---------------------------------------------------------------------------
# data_source -> metric
# ---------------------------------------------------------------------------

SOURCE_METRICS: dict[str, str] = {
    # Mem-alpha training/validation sources (official reward manager)
    "squad": "substring",
    "hotpotqa": "substring",
    "perltqa": "multi_part",
    "pubmed-rct": "boxed",
    "booksum": "keyword",
    "lme_train": "llm_judge",
    # MemoryAgentBench families (glob patterns)
    "longmemeval*": "llm_judge",
    "lme_*": "llm_judge",
    "icl_*": "boxed",
    "ttl_*": "boxed",
    "ruler_*": "substring",
    "infbench_sum*": "keyword",
    # memalpha's synthetic families
    "synth_personal": "substring",
    "synth_timeline": "substring",
    "synth_icl": "boxed",
    "synth_summary": "keyword",
}
"""Default mapping, exact names before glob patterns; config overrides take precedence."""

DEFAULT_METRIC = "substring"
_warned_sources: set[str] = set()


def _lookup(source: str, table: dict[str, str]) -> str | None:
    if source in table:
        return table[source]
    for pattern, metric in table.items():
        if any(ch in pattern for ch in "*?[") and fnmatch.fnmatchcase(source, pattern):
            return metric
    return None


def check_metric_overrides(overrides: dict[str, str], option: str = "metric overrides") -> None:
    """Raise ValueError naming ``option`` when an override names a metric that does not exist."""
    unknown = sorted(set(overrides.values()) - set(METRICS))
    if unknown:
        raise ValueError(f"{option} name unknown metrics {unknown}; known: {sorted(METRICS)}")


def metric_for_source(data_source: str, overrides: dict[str, str] | None = None) -> str:
    """The metric name for ``data_source``: overrides first, then :data:`SOURCE_METRICS`.

    Both tables take exact names or glob patterns (``icl_*``). An unknown source falls back
    to ``substring`` with one warning per source and process.
    """
    if overrides:
        check_metric_overrides(overrides)
        found = _lookup(data_source, overrides)
        if found is not None:
            return found
    found = _lookup(data_source, SOURCE_METRICS)
    if found is not None:
        return found
    if data_source not in _warned_sources:
        _warned_sources.add(data_source)
        logger.warning(
            "no metric is registered for data_source %r; scoring it with %r "
            "(set a metric override to change this)", data_source, DEFAULT_METRIC
        )
    return DEFAULT_METRIC


def score_answer(
    data_source: str,
    prediction: str,
    gold: Gold,
    question: str = "",
    judge: Reader | None = None,
    overrides: dict[str, str] | None = None,
) -> float:
    """Score one reader answer with the metric of its ``data_source`` (a float in [0, 1])."""
    name = metric_for_source(data_source, overrides)
    if name == "llm_judge":
        return llm_judge(prediction, gold, question=question, judge=judge)
    return METRICS[name](prediction, gold)


def score_answers(
    data_source: str,
    predictions: Sequence[str],
    golds: Sequence[Gold],
    questions: Sequence[str] | None = None,
    judge: Reader | None = None,
    overrides: dict[str, str] | None = None,
    ok: Sequence[bool] | None = None,
) -> list[float]:
    """Score many answers of one source; LLM-judge calls go to the judge as one batch.

    ``ok[i] == False`` (a failed reader call) scores 0 without being judged.
    """
    return score_answers_checked(data_source, predictions, golds, questions, judge, overrides, ok)[0]


def score_answers_checked(
    data_source: str,
    predictions: Sequence[str],
    golds: Sequence[Gold],
    questions: Sequence[str] | None = None,
    judge: Reader | None = None,
    overrides: dict[str, str] | None = None,
    ok: Sequence[bool] | None = None,
) -> tuple[list[float], list[str | None]]:
    """:func:`score_answers`, and for each answer the error of its failed judge call (None when
    none failed), so a 0 the judge never gave is counted as a reader failure, not as a wrong answer."""
    n = len(predictions)
    if len(golds) != n:
        raise ValueError(f"score_answers: {n} predictions but {len(golds)} golds")
    questions = list(questions) if questions is not None else [""] * n
    ok = list(ok) if ok is not None else [True] * n
    if len(questions) != n or len(ok) != n:
        raise ValueError(f"score_answers: {n} predictions but {len(questions)} questions / {len(ok)} ok flags")
    name = metric_for_source(data_source, overrides)
    scores = [0.0] * n
    judge_errors: list[str | None] = [None] * n
    live = [i for i in range(n) if ok[i]]
    if name == "llm_judge":
        if live:
            judged, errors = _judge_many(
                [predictions[i] for i in live], [golds[i] for i in live], [questions[i] for i in live], judge
            )
            for i, s, error in zip(live, judged, errors):
                scores[i], judge_errors[i] = s, error
        return scores, judge_errors
    metric = METRICS[name]
    for i in live:
        scores[i] = metric(predictions[i], golds[i])
    return scores, judge_errors

