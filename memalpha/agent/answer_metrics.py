"""Per-source scoring of reader answers: one registry, chosen by an instance's ``data_source``.

Six metrics (``substring``, ``multi_part``, ``boxed``, ``keyword``: pure functions
``(prediction, gold) -> float in [0, 1]``; ``locomo``: a pure function that also reads the
question's metadata, LoCoMo's category, :mod:`memalpha.agent.locomo_metrics`; ``llm_judge``: a
:class:`~memalpha.reader.base.Reader` answers a yes/no question) in two styles
(``reward.metric_style``): ``memalpha`` normalises on purpose (:func:`normalize_answer`, the best
of all golds), so that a right answer written differently still scores; ``official``
(:data:`OFFICIAL_METRICS`) compares as the official code does (for ``locomo``: LoCoMo's own
evaluation). A style changes how an answer is compared with its gold, never which metric a source
gets. A prediction's leading ``<think>...</think>`` block is removed before scoring
(:func:`reply_after_thinking`). docs/metrics_and_rewards.md ("Answer metrics and the source registry")
tables the metrics, the sources and both styles with examples.
"""

from __future__ import annotations

import fnmatch
import logging
import re
import string
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from memalpha.agent.locomo_metrics import locomo_f1, locomo_recall

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


def reply_after_thinking(prediction: str) -> str:
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
    pred = normalize_answer(reply_after_thinking(prediction))
    return float(any(_contains(pred, g) for g in golds))


def multi_part_match(prediction: str, gold: Gold) -> float:
    """Fraction of the ``;``-separated gold parts found in the prediction (max over golds)."""
    pred = normalize_answer(reply_after_thinking(prediction))
    best = 0.0
    for single in _golds(gold):
        parts = [p for p in (x.strip() for x in single.split(";")) if p]
        if not parts:
            continue
        best = max(best, sum(_contains(pred, p) for p in parts) / len(parts))
    return best


def boxed_label_match(prediction: str, gold: Gold) -> float:
    """1.0 when the reply's first boxed label (see :func:`extract_label`) equals a gold label."""
    label = extract_label(reply_after_thinking(prediction))
    if not label:
        return 0.0
    return float(any(label == g.strip().strip("\"'").strip() for g in _golds(gold)))


def _split_keywords(gold: Gold) -> list[str]:
    """The ``,``-separated keywords of every gold, as written."""
    return [k for g in _golds(gold) for k in g.split(",")]


def keyword_hit(prediction: str, gold: Gold) -> float:
    """Fraction of the gold's comma-separated keywords (or list items) found in the prediction.

    Matching is case-insensitive with white space collapsed; a multi-word keyword must
    appear as a whole.
    """
    keywords = [" ".join(k.lower().split()) for k in _split_keywords(gold) if k.strip()]
    if not keywords:
        return 0.0
    pred = " ".join(reply_after_thinking(prediction).lower().split())
    return sum(k in pred for k in keywords) / len(keywords)


def parse_yes_no(reply: str) -> float:
    """1.0 for a reply that says yes and not no (word-wise, after any thinking block), else 0.0."""
    words = set(_WORD.findall(reply_after_thinking(reply).lower()))
    return float("yes" in words and "no" not in words)


def _judge_many(
    predictions: Sequence[str],
    golds: Sequence[Gold],
    questions: Sequence[str],
    judge: Reader | None,
    style: AnswerStyle,
) -> tuple[list[float], list[str | None]]:
    """Ask ``judge`` whether each prediction satisfies its gold rubric, in one batched call: the
    scores (a failed call scores 0; ``style`` reads the replies), and for each the error of its
    failed judge call (None when it was judged)."""
    from memalpha.agent.memorise_prompts import answer_judge_prompt

    if judge is None:
        raise ValueError(
            "metric 'llm_judge' needs a judge (a memalpha.reader.Reader); configure a reader "
            "or override the metric for this data_source"
        )
    templates = getattr(judge, "templates", None)  # the judge reader's prompt templates
    prompts = [
        answer_judge_prompt(q, "; ".join(_golds(g)), reply_after_thinking(p), templates)
        for p, g, q in zip(predictions, golds, questions, strict=True)
    ]
    replies = judge.complete(prompts)
    scores = [style.read_judgement(r.text) if r.ok else 0.0 for r in replies]
    return scores, [None if r.ok else f"judge: {r.error}" for r in replies]


# ---------------------------------------------------------------------------
# the official style: compare as the official code does, nothing more normalised
# ---------------------------------------------------------------------------


def official_first_gold_match(prediction: str, gold: Gold) -> float:
    """1.0 when the lower-cased first gold occurs in the lower-cased prediction.

    Only the first gold counts and nothing but case is normalised, so ``U.S.A.`` misses the
    gold ``USA`` and an answer naming the second gold scores 0.
    """
    golds = _golds(gold)
    if not golds:
        return 0.0
    return float(golds[0].lower() in reply_after_thinking(prediction).lower())


def official_multi_part_match(prediction: str, gold: Gold) -> float:
    """Fraction of the ``;``-separated gold parts in the prediction, the official way (max over golds).

    With a ``;`` each part is lower-cased and stripped but the prediction is not lower-cased,
    so a capitalised answer misses a part; every piece of the split counts, an empty one as
    found. Without a ``;`` both sides are lower-cased.
    """
    pred = reply_after_thinking(prediction)
    best = 0.0
    for single in _golds(gold):
        if ";" in single:
            parts = single.split(";")
            score = sum(part.lower().strip() in pred for part in parts) / len(parts)
        else:
            score = float(single.lower() in pred.lower())
        best = max(best, score)
    return best


_DIGITS = re.compile(r"\d+")


def official_boxed_digits_match(prediction: str, gold: Gold) -> float:
    """1.0 when the first ``\\boxed{}`` (else the whole reply), without quotes, is all digits and
    equals a gold label; ``<answer>`` tags and ``\\box{}`` are not read."""
    reply = reply_after_thinking(prediction)
    match = _BOXED.search(reply)
    label = (match.group(1) if match else reply).strip().strip("\"'").strip()
    if not _DIGITS.fullmatch(label):
        return 0.0
    return float(any(label == g.strip("\"'").strip() for g in _golds(gold)))


def official_keyword_hit(prediction: str, gold: Gold) -> float:
    """Fraction of the ``,``-separated keywords (stripped) found in the prediction, both sides
    only lower-cased (white space is not collapsed); an empty keyword counts as found."""
    keywords = [k.strip().lower() for k in _split_keywords(gold)]
    if not keywords:
        return 0.0
    pred = reply_after_thinking(prediction).lower()
    return sum(k in pred for k in keywords) / len(keywords)


def official_yes_no(reply: str) -> float:
    """1.0 when the lower-cased reply contains ``yes`` and nowhere ``no``, as substrings.

    So "Yes, nothing is missing" scores 0 (``no`` in "nothing"). The official judge runs
    without thinking; a thinking block is removed first all the same.
    """
    text = reply_after_thinking(reply).lower()
    return float("yes" in text and "no" not in text)


METRICS: dict[str, Callable[[str, Gold], float]] = {
    "substring": substring_match,
    "multi_part": multi_part_match,
    "boxed": boxed_label_match,
    "keyword": keyword_hit,
}
"""Rule metric name -> its pure ``(prediction, gold)`` function; ``llm_judge`` asks a judge instead."""

OFFICIAL_METRICS: dict[str, Callable[[str, Gold], float]] = {
    "substring": official_first_gold_match,
    "multi_part": official_multi_part_match,
    "boxed": official_boxed_digits_match,
    "keyword": official_keyword_hit,
}
"""The ``official`` style's function for each rule metric (the judge differs only in reading its reply)."""

QuestionMetric = Callable[[str, str, Mapping[str, Any]], float]
"""A metric that reads the question's metadata too: ``(prediction, gold, metadata) -> float``."""

METRIC_NAMES = (*METRICS, "locomo", "llm_judge")

MetricStyle = Literal["memalpha", "official"]


@dataclass(frozen=True)
class AnswerStyle:
    """How answers are compared with their golds (``reward.metric_style``), picked once from the
    setting's name (:data:`ANSWER_STYLES`): each rule metric's function, each metric's that reads
    the question's metadata (``question_metrics``), and how an LLM judge's yes/no reply is read."""

    name: str
    metrics: Mapping[str, Callable[[str, Gold], float]]
    read_judgement: Callable[[str], float]
    question_metrics: Mapping[str, QuestionMetric]


MEMALPHA_ANSWERS = AnswerStyle("memalpha", METRICS, parse_yes_no, {"locomo": locomo_recall})
OFFICIAL_ANSWERS = AnswerStyle("official", OFFICIAL_METRICS, official_yes_no, {"locomo": locomo_f1})
ANSWER_STYLES: dict[str, AnswerStyle] = {style.name: style for style in (MEMALPHA_ANSWERS, OFFICIAL_ANSWERS)}
"""Each ``reward.metric_style`` name's :class:`AnswerStyle`."""

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
    "synth_conversation": "substring",
    "synth_document": "substring",
    # LoCoMo (the locomo layout): its protocol per question category
    "locomo": "locomo",
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
    unknown = sorted(set(overrides.values()) - set(METRIC_NAMES))
    if unknown:
        raise ValueError(f"{option} name unknown metrics {unknown}; known: {sorted(METRIC_NAMES)}")


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
    style: AnswerStyle = MEMALPHA_ANSWERS,
) -> float:
    """Score one reader answer with the metric of its ``data_source`` (a float in [0, 1]),
    compared in the answer ``style`` (memalpha's or the official code's)."""
    return score_answers(data_source, [prediction], [gold], [question], judge, overrides, style=style)[0][0]


def score_answers(
    data_source: str,
    predictions: Sequence[str],
    golds: Sequence[Gold],
    questions: Sequence[str] | None = None,
    judge: Reader | None = None,
    overrides: dict[str, str] | None = None,
    ok: Sequence[bool] | None = None,
    style: AnswerStyle = MEMALPHA_ANSWERS,
    metadata: Sequence[Mapping[str, Any]] | None = None,
) -> tuple[list[float], list[str | None]]:
    """Score many answers of one source in the answer ``style``; LLM-judge calls go to the judge
    as one batch.

    ``ok[i] == False`` (a failed reader call) scores 0 without being judged. ``metadata`` holds each
    question's metadata, which the ``locomo`` metric reads (its category).

    Returns:
        The scores, and for each answer the error of its failed judge call (None when none failed),
        so a 0 the judge never gave is counted as a reader failure, not as a wrong answer.
    """
    n = len(predictions)
    if len(golds) != n:
        raise ValueError(f"score_answers: {n} predictions but {len(golds)} golds")
    questions = list(questions) if questions is not None else [""] * n
    ok = list(ok) if ok is not None else [True] * n
    metadata = list(metadata) if metadata is not None else [{}] * n
    if len(questions) != n or len(ok) != n or len(metadata) != n:
        raise ValueError(
            f"score_answers: {n} predictions but {len(questions)} questions / {len(ok)} ok flags / "
            f"{len(metadata)} metadata"
        )
    name = metric_for_source(data_source, overrides)
    scores = [0.0] * n
    judge_errors: list[str | None] = [None] * n
    live = [i for i in range(n) if ok[i]]
    if name == "llm_judge":
        if live:
            judged, errors = _judge_many(
                [predictions[i] for i in live], [golds[i] for i in live], [questions[i] for i in live], judge,
                style,
            )
            for i, s, error in zip(live, judged, errors):
                scores[i], judge_errors[i] = s, error
        return scores, judge_errors
    if name in style.question_metrics:
        question_metric = style.question_metrics[name]
        for i in live:
            prediction = reply_after_thinking(predictions[i])
            scores[i] = max(question_metric(prediction, g, metadata[i]) for g in _golds(golds[i]))
        return scores, judge_errors
    metric = style.metrics[name]
    for i in live:
        scores[i] = metric(predictions[i], golds[i])
    return scores, judge_errors
