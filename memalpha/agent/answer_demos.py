"""Answer demonstrations: the reader's prompt for a question asked of a memory, and the gold answer
as short as the source's metric wants it (docs/answer_agent.md).

They train the answer agent (``memalpha sft`` on them; ``reader.adapter_path`` then answers with the
adapter). The memories come from records a memory agent wrote in its own rollouts, a ``memalpha
predict`` output (JSONL, one record per instance) or a validation report (``{"records": [...]}``), so
that the answer agent learns to pick the right entry among the look-alike ones its memory agent
writes, not only from oracle memories. Each record needs its ``memory`` (the memory-file dictionary),
``data_source`` and ``questions`` (each with ``question`` and ``gold``; the ``memories`` layout,
:mod:`memalpha.data.memory_records`); the prompt is the reader's own
(:meth:`~memalpha.reader.base.Reader.answer_conversations`: retrieval, question instruction, budget),
so the adapter learns on exactly what it will be shown.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from memalpha.agent.answer_metrics import metric_for_source
from memalpha.data.demo_files import Demonstration
from memalpha.data.loaders import load_instances
from memalpha.data.memory_records import MEMORY, parse_memory_record
from memalpha.data.schema import DataValidationError, Instance
from memalpha.memory.store import Memory
from memalpha.reader.base import Reader

UNTEACHABLE = ("llm_judge",)
"""Metrics whose gold is not an answer to imitate (a judge's rubric): their questions are left out."""


def target_answer(gold: Any, metric: str) -> str | None:
    """The answer to learn for ``gold`` under ``metric``: the first gold of a list (``multi_part``:
    every part, joined by commas), ``\\boxed{label}`` for ``boxed``, the gold itself otherwise; None
    for a metric whose gold is no answer (:data:`UNTEACHABLE`)."""
    if metric in UNTEACHABLE:
        return None
    golds = [gold] if isinstance(gold, str) else [str(g) for g in gold]
    if metric == "multi_part":
        return ", ".join(golds)
    if metric == "boxed":
        return f"\\boxed{{{golds[0]}}}"
    return golds[0]


def read_memory_records(path: str | Path) -> list[Instance]:
    """The memories of a ``memalpha predict`` output (JSONL, the ``memories`` layout) or of a
    validation report (JSON with ``records``), as instances with no chunks, their memory in
    ``metadata["memory"]`` (:func:`~memalpha.data.memory_records.parse_memory_record`); a bad record
    is one line naming the file, the record and the field."""
    path = Path(path)
    name = str(path)
    try:
        whole = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise DataValidationError(name, f"cannot be read ({exc})") from None
    except json.JSONDecodeError:  # JSONL
        whole = None
    if isinstance(whole, dict) and "records" in whole:  # a validation report
        if not isinstance(whole["records"], list) or not whole["records"]:
            raise DataValidationError(name, "'records' is not a non-empty list: not a validation report")
        return [parse_memory_record(record, name, i) for i, record in enumerate(whole["records"])]
    instances, _ = load_instances(path, layout="memories")  # JSONL (a one-line file is a JSON object too)
    return instances


def answer_demonstrations(
    instances: Iterable[Instance],
    reader: Reader,
    count_tokens: Callable[[str], int],
    *,
    metric_overrides: dict[str, str] | None = None,
) -> tuple[list[Demonstration], int]:
    """One demonstration per question of every ``memories`` instance: the reader's answer prompt for
    the question over its memory (its tokens counted by ``count_tokens``), and :func:`target_answer` of
    its gold under the source's metric (``metric_overrides`` first). Returns the demonstrations and
    the number of questions left out because their metric's gold is no answer."""
    demos: list[Demonstration] = []
    skipped = 0
    for instance in instances:
        memory = Memory.from_dict(dict(instance.metadata[MEMORY]), token_counter=count_tokens)
        source = instance.data_source
        metric = metric_for_source(source, metric_overrides)
        asked: list[tuple[str, str]] = []
        for qa in instance.questions:
            target = target_answer(qa.answer, metric)
            if target is None:
                skipped += 1
            else:
                asked.append((qa.question, target))
        conversations = reader.answer_conversations([(memory, q) for q, _ in asked], [source] * len(asked))
        for messages, (question, target) in zip(conversations, asked):
            metadata = {"source": "answers", "instance_id": instance.instance_id, "data_source": source,
                        "question": question}
            demos.append(Demonstration(messages, target, metadata))
    return demos, skipped


def records_of(paths: Sequence[str | Path]) -> list[Instance]:
    """The memories of every file of ``paths`` in order (:func:`read_memory_records`)."""
    return [record for path in paths for record in read_memory_records(path)]
