"""LoCoMo's answer metric, per question category: pure functions of a prediction, its gold and the
question's metadata (``category``, and an adversarial question's ``options``; the ``locomo``
layout writes both, :mod:`memalpha.data.locomo`).

Both answer styles follow LoCoMo's protocol per category and compare the same tokens (lower-cased,
commas and punctuation dropped, the words a/an/the/and dropped, each word Porter-stemmed with
nltk's ``PorterStemmer``):

* ``official`` (:func:`locomo_f1`) is LoCoMo's own number, its token F1, computed as the
  benchmark's evaluation code (``task_eval/evaluation.py`` of snap-research/LoCoMo) does;
* ``memalpha`` (:func:`locomo_recall`) is the share of the gold's tokens the prediction holds:
  an answer that holds the gold in other words, or with more words around it, still scores.

Memory-agent papers that train on LoCoMo (Memory-R1 among them) also report BLEU-1 beside F1:
:func:`bleu1`, on the whole gold, for every category but the adversarial one.

Per category (LoCoMo's numbers): 1 multi-hop: the gold is split on ``,`` into sub-answers, and
the score is their mean, each sub-answer scored against the best ``,``-separated part of the
prediction (recall: against the whole prediction); 2 temporal and 4 single-hop: the whole gold;
3 open-domain: the gold's part before its first ``;``; 5 adversarial: 1 when the prediction says
the information is not there (it holds "not mentioned" or "no information available"), after an
answer that is just an option letter is read as that option. docs/metrics_and_rewards.md shows
worked examples.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Any

from memalpha.data.locomo import ADVERSARIAL, CATEGORY_NAMES

_DROPPED_WORDS = re.compile(r"\b(a|an|the|and)\b")
_PUNCTUATION = set(string.punctuation)
_NOT_THERE = ("not mentioned", "no information available")
_LETTER = re.compile(r"^\(?([ab])\)?[.:]?$")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


@lru_cache(maxsize=1)
def _stemmer():
    from nltk.stem import PorterStemmer  # nltk loads in a second; only LoCoMo's metric needs it

    return PorterStemmer()


def locomo_tokens(text: str) -> list[str]:
    """The words LoCoMo compares: commas removed, lower-cased, punctuation removed, a/an/the/and
    removed, split on white space, each Porter-stemmed."""
    text = "".join(ch for ch in text.replace(",", "").lower() if ch not in _PUNCTUATION)
    stem = _stemmer().stem
    return [stem(word) for word in _DROPPED_WORDS.sub(" ", text).split()]


def token_f1(prediction: str, gold: str) -> float:
    """LoCoMo's token F1 of ``prediction`` against ``gold`` (0 when they share no token)."""
    pred, ref = locomo_tokens(prediction), locomo_tokens(gold)
    same = sum((Counter(pred) & Counter(ref)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(ref)
    return 2 * precision * recall / (precision + recall)


def token_recall(prediction: str, gold: str) -> float:
    """The share of ``gold``'s tokens (with their counts) that ``prediction`` holds; 0 for a gold
    without tokens."""
    ref = locomo_tokens(gold)
    if not ref:
        return 0.0
    return sum((Counter(locomo_tokens(prediction)) & Counter(ref)).values()) / len(ref)


def bleu1(prediction: str, gold: str) -> float:
    """BLEU-1 of ``prediction`` against ``gold`` as the memory-agent papers compute it on LoCoMo: nltk's
    ``sentence_bleu`` with all weight on unigrams and smoothing method 1, over lower-cased word tokens
    (nltk's Treebank tokenizer, each sentence on its own, as ``nltk.word_tokenize`` does; sentences end
    at ``.``, ``!`` or ``?`` before white space, where ``word_tokenize`` asks nltk's punkt data). The
    clipped share of the prediction's tokens found in the gold, times the brevity penalty
    ``exp(1 - len(gold) / len(prediction))`` when the prediction is the shorter; 0 when no token is
    shared or either side has none."""
    from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu

    pred, ref = word_tokens(prediction), word_tokens(gold)
    if not pred or not ref:
        return 0.0
    smooth = SmoothingFunction().method1
    return float(sentence_bleu([ref], pred, weights=(1, 0, 0, 0), smoothing_function=smooth))


@lru_cache(maxsize=1)
def _word_tokenizer():
    from nltk.tokenize import NLTKWordTokenizer

    return NLTKWordTokenizer()


def word_tokens(text: str) -> list[str]:
    """``text`` lower-cased and cut into Treebank word tokens, sentence by sentence."""
    tokenize = _word_tokenizer().tokenize
    return [token for sentence in _SENTENCE_END.split(text.lower().strip()) for token in tokenize(sentence)]


def multi_hop_f1(prediction: str, gold: str) -> float:
    """Mean over the gold's ``,``-separated sub-answers of the best :func:`token_f1` against a
    ``,``-separated part of the prediction."""
    parts = [p.strip() for p in prediction.split(",")]
    subs = [g.strip() for g in gold.split(",")]
    return sum(max(token_f1(p, g) for p in parts) for g in subs) / len(subs)


def multi_hop_recall(prediction: str, gold: str) -> float:
    """Mean over the gold's ``,``-separated sub-answers of their :func:`token_recall` in the whole
    prediction."""
    subs = [g.strip() for g in gold.split(",")]
    return sum(token_recall(prediction, g) for g in subs) / len(subs)


def open_domain_gold(gold: str) -> str:
    """An open-domain gold's answer: its part before the first ``;`` (the rest explains it)."""
    return gold.split(";")[0].strip()


def chosen_option_official(prediction: str, options: Mapping[str, str]) -> str:
    """The reply as LoCoMo reads an adversarial answer: stripped and lower-cased, one character is
    option ``a`` when it is ``a`` and option ``b`` otherwise, three characters option ``a`` when they
    hold ``(a)`` and ``b`` otherwise (so a bare "No." reads as ``b``), anything else itself."""
    reply = prediction.strip().lower()
    if len(reply) == 1:
        return options["a"] if "a" in reply else options["b"]
    if len(reply) == 3:
        return options["a"] if "(a)" in reply else options["b"]
    return reply


def chosen_option(prediction: str, options: Mapping[str, str]) -> str:
    """The reply, or the option it names when it is only an option letter (``a``, ``(b)``, ``b.``)."""
    match = _LETTER.match(prediction.strip().lower())
    return options[match.group(1)] if match else prediction


def says_not_there(text: str) -> float:
    """1.0 when ``text`` says the information is not there, as LoCoMo checks it: it holds "not
    mentioned" or "no information available" (case-insensitive)."""
    lowered = text.lower()
    return float(any(phrase in lowered for phrase in _NOT_THERE))


def question_category(metadata: Mapping[str, Any]) -> int:
    """The LoCoMo category of a question's metadata; a ValueError naming the metric when there is none."""
    category = metadata.get("category")
    if isinstance(category, bool) or category not in CATEGORY_NAMES:
        raise ValueError(
            f"metric 'locomo' scores each question by its LoCoMo category (question metadata 'category', "
            f"one of {sorted(CATEGORY_NAMES)}), got {category!r}: load the data with the locomo layout"
        )
    return category


def _options(metadata: Mapping[str, Any]) -> Mapping[str, str]:
    options = metadata.get("options")
    if not isinstance(options, Mapping) or set(options) != {"a", "b"}:
        raise ValueError(
            "metric 'locomo': an adversarial question needs its two options (question metadata "
            f"'options' with keys a and b), got {options!r}: load the data with the locomo layout"
        )
    return options


def by_category(
    prediction: str,
    gold: str,
    metadata: Mapping[str, Any],
    *,
    compare: Callable[[str, str], float],
    multi_hop: Callable[[str, str], float],
    read_option: Callable[[str, Mapping[str, str]], str],
) -> float:
    """One answer scored by LoCoMo's protocol for its question's category, with ``compare`` for a
    whole gold (or an open-domain gold's first part), ``multi_hop`` for a multi-hop one, and
    ``read_option`` turning an adversarial reply into the text that is checked."""
    category = question_category(metadata)
    if category == ADVERSARIAL:
        return says_not_there(read_option(prediction, _options(metadata)))
    if category == 1:
        return multi_hop(prediction, gold)
    return compare(prediction, open_domain_gold(gold) if category == 3 else gold)


def locomo_f1(prediction: str, gold: str, metadata: Mapping[str, Any]) -> float:
    """LoCoMo's own score of one answer (its evaluation code's, category by category)."""
    return by_category(
        prediction, gold, metadata,
        compare=token_f1, multi_hop=multi_hop_f1, read_option=chosen_option_official,
    )  # fmt: skip


def locomo_recall(prediction: str, gold: str, metadata: Mapping[str, Any]) -> float:
    """memalpha's score of one answer by LoCoMo's protocol: the gold's token recall instead of F1."""
    return by_category(
        prediction, gold, metadata,
        compare=token_recall, multi_hop=multi_hop_recall, read_option=chosen_option,
    )  # fmt: skip
