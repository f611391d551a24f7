"""The deterministic parts of the Mem-α processing of MemoryAgentBench
(``data convert --processing official``); docs/data.md, *Building it from the raw benchmark*, gives
the rules and what is not rebuilt (the official sentence splitter, tokenizer, wrapper texts and day
gaps, ``longmemeval_s*`` session rendering and keyword extraction).

From raw records (:func:`memalpha.data.loaders.parse_memoryagentbench_record`), per instance:
source selection (:func:`drop_reason`); sentence chunks (:func:`split_sentences`,
:func:`pack_sentences`), 1,024 tokens for the test-time-learning sources (``icl_*``) and
``chunk_tokens`` for the others, while ``longmemeval_s*`` keeps the loader's token chunks; the
Sentence/Label rewrite of the ``icl_*`` chunks (:func:`rewrite_labelled_chunk`); a summary question
with keyword golds (:func:`load_keyword_golds`) for ``infbench_sum*``; and dated wrappers, reading
events for ``infbench_sum*`` and dialogue turns for the others but ``longmemeval_s*``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from memalpha.data.chunking import TEST_TIME_LEARNING_CHUNK_TOKENS
from memalpha.data.schema import QA, Instance
from memalpha.data.wrapping import chunk_day, wrap_chunks

PROCESSINGS = ("none", "official")
"""Values of ``memalpha data convert --processing``."""

DROPPED_SOURCES = (
    "longmemeval_s_-1_500",
    "eventqa_65536",
    "eventqa_131072",
    "eventqa_full",
    "infbench_qa_eng_shots2",
    "recsys_redial_full",
)
"""Sources the official processing skips by exact name (besides every ``niah`` source)."""

KEYWORD_OPTION = "--keyword-golds"

_SENTENCE_END = re.compile(r"(?:(?<=[.!?])|(?<=[.!?][\"')\]]))\s+")
_END_OF_TEXT = "<|endoftext|>"


def drop_reason(source: str) -> str | None:
    """Why the official processing leaves ``source`` out of the evaluation set, or ``None`` if it keeps it."""
    if "niah" in source:
        return "a needle-in-a-haystack source"
    if source in DROPPED_SOURCES:
        return "left out of the official evaluation set by name"
    if source.startswith("factconsolidation"):
        return "a Conflict_Resolution source (that split is not in the official evaluation set)"
    return None


def is_test_time_learning(source: str) -> bool:
    """The classification sources of the Test_Time_Learning split (``icl_*``): 1,024-token chunks,
    rewritten."""
    return source.startswith("icl_")


def needs_keyword_golds(source: str) -> bool:
    """The long-range summary sources, whose question and gold the official processing replaces."""
    return source.startswith("infbench_sum")


def split_sentences(text: str) -> list[str]:
    """Sentences of ``text``: cut after ``.``, ``!`` or ``?`` (or one of them and a closing quote or
    bracket) followed by white space; that white space is dropped, everything else kept, and empty pieces
    are left out. Line breaks inside a sentence stay."""
    return [piece for piece in _SENTENCE_END.split(text.strip()) if piece.strip()]


def pack_sentences(
    sentences: Sequence[str], count_tokens: Callable[[str], int], max_tokens: int
) -> list[str]:
    """Sentences packed in order into chunks of at most ``max_tokens`` tokens, joined by one space.

    A chunk's size is the sum of its sentences' token counts plus ``count_tokens(" ")`` for each
    join; a sentence that would take the chunk over the budget starts the next one (a sentence over
    the budget on its own is a chunk alone). ``<|endoftext|>`` inside a sentence becomes a line break
    first. The chunks are stripped.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    space = count_tokens(" ")
    chunks: list[str] = []
    current: list[str] = []
    size = 0
    for sentence in sentences:
        sentence = sentence.replace(_END_OF_TEXT, "\n")
        tokens = count_tokens(sentence)
        if current and size + tokens > max_tokens:
            chunks.append(" ".join(current).strip())
            current, size = [sentence], tokens
        elif current:
            current.append(sentence)
            size += tokens + space
        else:
            current, size = [sentence], tokens
    if current:
        chunks.append(" ".join(current).strip())
    return [chunk for chunk in chunks if chunk]


def rewrite_labelled_chunk(chunk: str) -> str:
    """A test-time-learning chunk as ``Sentence: {text}\nLabel: {label}`` pairs, one for each blank-line
    separated piece that ``label:`` splits in exactly two with a non-empty text (an example cut by a
    chunk boundary keeps only its labelled end); the empty string when there is none."""
    pairs = []
    for piece in chunk.split("\n\n"):
        parts = piece.split("label:")
        if len(parts) != 2:
            continue
        sentence, label = parts[0].strip(), parts[1].strip()
        if sentence:
            pairs.append(f"Sentence: {sentence}\nLabel: {label}")
    return "\n\n".join(pairs).strip()


def summary_question(first_day: str, last_day: str) -> str:
    """The long-range question that replaces the benchmark's (memalpha's wording)."""
    return f"Summarise the book I read between {first_day} and {last_day}."


# --------------------------------------------------------------------------- keyword golds


def load_keyword_golds(path: str | Path) -> dict[str, list[str]]:
    """The keyword table of ``--keyword-golds``: a key (an instance id or a data source) -> keywords.

    Accepted: a JSON object whose values are a list of keywords, a comma-separated string or an
    object with a ``keywords`` field (the shape the official keyword script writes, keyed by the
    record's position in its split); or JSONL, one object a line with ``keywords`` and
    ``instance_id``, ``id`` or ``source``. Raises a one-line ``ValueError`` naming the file.
    """
    file = Path(path).expanduser()
    where = f"{KEYWORD_OPTION} {file}"
    if not file.is_file():
        raise ValueError(f"{where}: no such file")
    text = file.read_text(encoding="utf-8")
    try:
        data: Any = json.loads(text)
    except json.JSONDecodeError:
        data = None
    if not isinstance(data, dict):
        data = {}
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(
                    f"{where}: line {number} is not JSON ({exc.msg}); expected a JSON object or JSONL"
                ) from None
            key = next(
                (row[k] for k in ("instance_id", "id", "source") if isinstance(row, dict) and k in row), None
            )
            if key is None:
                raise ValueError(f"{where}: line {number} has no instance_id, id or source")
            data[str(key)] = row
    table = {}
    for key, value in data.items():
        keywords = _keywords(value)
        if keywords is None:
            raise ValueError(
                f"{where}: entry {key!r} must be a non-empty list of keywords, a comma-separated string "
                "or an object with 'keywords'"
            )
        table[str(key)] = keywords
    return table


def _keywords(value: Any) -> list[str] | None:
    if isinstance(value, dict):
        value = value.get("keywords")
    if isinstance(value, str):
        value = value.split(",")
    if not isinstance(value, list) or not all(isinstance(k, str) for k in value):
        return None
    keywords = [k.strip() for k in value if k.strip()]
    return keywords or None


def keyword_golds_for(instance: Instance, table: Mapping[str, list[str]] | None) -> list[str]:
    """The keywords of ``instance`` (its id first, then its source); a one-line ``ValueError`` naming the
    source and :data:`KEYWORD_OPTION` when there is no table or no entry."""
    if table is None:
        raise ValueError(
            f"source {instance.data_source!r} needs keyword golds for its summary question: "
            f"pass {KEYWORD_OPTION} FILE (JSON or JSONL, instance id or source -> keywords)"
        )
    for key in (instance.instance_id, instance.data_source):
        if key in table:
            return list(table[key])
    raise ValueError(
        f"source {instance.data_source!r}: {KEYWORD_OPTION} has no entry for instance "
        f"{instance.instance_id!r} or for the source"
    )


# --------------------------------------------------------------------------- instances


def process_official(
    instances: Sequence[Instance],
    count_tokens: Callable[[str], int],
    *,
    chunk_tokens: int,
    keyword_golds: Mapping[str, list[str]] | None = None,
) -> tuple[list[Instance], list[tuple[str, str, str]]]:
    """The official processing of raw MemoryAgentBench instances (see the module docstring): the kept
    instances, processed, and ``(instance id, source, reason)`` of each dropped one.

    Each instance's context is ``"".join(instance.chunks)`` (the loader's token chunks concatenate
    back to it), so any loader chunk size works. ``longmemeval_s*`` instances keep their chunks.
    """
    kept: list[Instance] = []
    dropped: list[tuple[str, str, str]] = []
    for instance in instances:
        reason = drop_reason(instance.data_source)
        if reason is not None:
            dropped.append((instance.instance_id, instance.data_source, reason))
            continue
        kept.append(
            process_instance(instance, count_tokens, chunk_tokens=chunk_tokens, keyword_golds=keyword_golds)
        )
    return kept, dropped


def process_instance(
    instance: Instance,
    count_tokens: Callable[[str], int],
    *,
    chunk_tokens: int,
    keyword_golds: Mapping[str, list[str]] | None = None,
    ttl_chunk_tokens: int = TEST_TIME_LEARNING_CHUNK_TOKENS,
) -> Instance:
    """One kept instance: re-chunked by sentence, rewritten and wrapped as its source requires."""
    source = instance.data_source
    questions = list(instance.questions)
    if source.startswith("longmemeval_s"):
        return replace(instance, metadata={**instance.metadata, "processing": "official"})
    context = "".join(instance.chunks)
    budget = ttl_chunk_tokens if is_test_time_learning(source) else chunk_tokens
    chunks = pack_sentences(split_sentences(context), count_tokens, budget)
    if is_test_time_learning(source):
        chunks = [text for text in (rewrite_labelled_chunk(c) for c in chunks) if text]
    if not chunks:
        raise ValueError(
            f"source {source!r}, instance {instance.instance_id!r}: no chunk left after the processing"
        )
    if needs_keyword_golds(source):
        keywords = keyword_golds_for(instance, keyword_golds)
        question = summary_question(f"{chunk_day(0):%Y-%m-%d}", f"{chunk_day(len(chunks) - 1):%Y-%m-%d}")
        questions = [QA(question, list(keywords)) for _ in questions]
        chunks = wrap_chunks(chunks, "reading")
    else:
        chunks = wrap_chunks(chunks, "dialogue")
    metadata = {**instance.metadata, "processing": "official", "chunk_tokens": budget}
    return Instance(instance.instance_id, source, chunks, questions, metadata)
