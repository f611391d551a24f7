"""Loading instances from every supported source and layout, and writing memalpha's JSONL.

Sources (``source`` argument of :func:`load_instances`):

* a ``.jsonl`` / ``.json`` / ``.parquet`` file;
* a folder written by ``datasets``' ``save_to_disk`` (a ``Dataset`` or a ``DatasetDict``);
* any other folder: its data file for ``split`` (``train.jsonl``, ``validation.parquet``,
  ``data/test-00000-of-00001.parquet``, ...), or its only data file;
* a hub dataset name (``owner/name``) that is not a local path, through
  ``datasets.load_dataset`` (needs the machine to be online or the hub cache warm).

Layouts (``layout``; ``auto`` looks at the first record's fields; docs/data.md gives each one's
fields): ``jsonl``, memalpha's own schema (:mod:`memalpha.data.schema`) in JSONL, JSON or parquet;
``memalpha``, the official Mem-α parquet; ``memoryagentbench``, one long ``context`` per record, cut
into chunks of ``chunk_tokens`` tokens of ``tokenizer``; ``longmemeval`` (:mod:`memalpha.data.longmemeval`);
``locomo`` (:mod:`memalpha.data.locomo`), whose sessions longer than ``chunk_tokens`` are split
between turns; ``memories`` (:mod:`memalpha.data.memory_records`), memories an agent wrote with
their questions (``memalpha predict`` outputs), what the answer agent trains on.

A file with a bad record is refused as a whole; with ``skip_bad=True`` the bad records are
skipped instead, each reported (logger ``memalpha.data``) with its reason and counted in
the :class:`LoadReport`.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from memalpha.atomic_file import write_atomically
from memalpha.data.chunking import DEFAULT_CHUNK_TOKENS, chunk_by_tokens, count_tokens
from memalpha.data.locomo import load_notes, parse_locomo_record
from memalpha.data.longmemeval import parse_longmemeval_record
from memalpha.data.memory_records import is_memory_record, parse_memory_record
from memalpha.data.schema import QA, DataValidationError, Instance, RecordChecker, parse_record
from memalpha.data.wrapping import WRAP_STYLES, wrap_chunks

logger = logging.getLogger("memalpha.data")

Layout = Literal["auto", "jsonl", "memalpha", "memoryagentbench", "longmemeval", "locomo", "memories"]
LAYOUTS: tuple[str, ...] = get_args(Layout)
DATA_SUFFIXES = (".jsonl", ".ndjson", ".json", ".parquet")
_HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass
class RawRecord:
    """One record as read from a source: its value, or why it could not be read."""

    index: int
    value: Any = None
    error: DataValidationError | None = None


@dataclass
class LoadReport:
    """What a load did: the layout used, how many records were read, kept and skipped (with reasons),
    and ``notes``: what the load changed in the data that the user must know (LoCoMo sessions split,
    evidence ids left out), each also logged as a warning."""

    source: str
    layout: str
    records: int = 0
    loaded: int = 0
    skipped: list[tuple[int, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def num_skipped(self) -> int:
        return len(self.skipped)


# ---------------------------------------------------------------------------
# public API
# ---------------------------------------------------------------------------


def load_instances(
    source: str | Path,
    layout: str = "auto",
    tokenizer: Any = None,
    chunk_tokens: int | None = DEFAULT_CHUNK_TOKENS,
    wrap: str | None = None,
    skip_bad: bool = False,
    split: str | None = None,
    limit: int | None = None,
) -> tuple[list[Instance], LoadReport]:
    """Load and validate instances from ``source`` (see the module docstring for sources and layouts).

    Args:
        source: file, folder or hub dataset name.
        layout: ``auto``, ``jsonl``, ``memalpha``, ``memoryagentbench``, ``longmemeval``, ``locomo`` or
            ``memories`` (memories an agent wrote, with their questions: :mod:`memalpha.data.memory_records`).
        tokenizer: tokenizer (object, or a model name / path for
            :func:`memalpha.lm.core.embedded.load_tokenizer`) used to chunk MemoryAgentBench contexts
            (required for that layout) and to measure LoCoMo sessions (white-space words without it).
        chunk_tokens: chunk size in tokens for MemoryAgentBench contexts (official: 2048; 1024 for the
            test-time-learning sets); the longest LoCoMo session chunk. None: the caller knows no
            size (``data.load.chunk_tokens: null`` without a prompt budget), and those two layouts
            are refused.
        wrap: ``None``, ``"dialogue"`` or ``"reading"``: wrap every chunk as a dated dialogue turn or a
            dated reading event (chunk ``i`` dated 2024-01-01 + ``i`` days).
        skip_bad: skip (and report) bad records instead of refusing the whole source.
        split: which split of a folder, a ``DatasetDict`` or a hub dataset; ignored for a single file.
        limit: read only the first ``limit`` records.

    Returns:
        The instances, and the :class:`LoadReport` of the load (layout, counts, skip reasons).

    Raises:
        DataValidationError: naming the file, record and field, for the first bad record (unless
            ``skip_bad``) or when the source cannot be read at all.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; expected one of {LAYOUTS}")
    if wrap is not None and wrap not in WRAP_STYLES:
        raise ValueError(f"unknown wrap {wrap!r}; expected None or one of {WRAP_STYLES}")
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    label, records = read_records(source, split=split)
    if limit is not None:
        records = records[:limit]
    if not records:
        raise DataValidationError(label, "no records")
    if layout == "auto":
        layout = detect_layout(records, label)
    report = LoadReport(source=label, layout=layout, records=len(records))
    parse = _record_parser(layout, tokenizer=tokenizer, chunk_tokens=chunk_tokens)

    instances: list[Instance] = []
    seen: dict[str, int] = {}
    for raw in records:
        try:
            if raw.error is not None:
                raise raw.error
            instance = parse(raw.value, label, raw.index)
            if instance.instance_id in seen:
                raise DataValidationError(
                    label,
                    f"duplicate instance id (first used by record {seen[instance.instance_id]})",
                    index=raw.index,
                    instance_id=instance.instance_id,
                    field="instance_id",
                )
        except DataValidationError as exc:
            if not skip_bad:
                raise
            report.skipped.append((raw.index, str(exc)))
            logger.warning("skipping bad record: %s", exc)
            continue
        seen[instance.instance_id] = raw.index
        if wrap is not None:
            instance.chunks = wrap_chunks(instance.chunks, wrap)
            instance.metadata = {**instance.metadata, "wrap": wrap}
        instances.append(instance)
    report.loaded = len(instances)
    if layout == "locomo":
        unit = "tokens" if tokenizer is not None else "white-space words"
        report.notes = load_notes(instances, label, unit)
    for note in report.notes:
        logger.warning("%s", note)
    if report.skipped:
        logger.warning(
            "%s: skipped %d of %d records (bad records), loaded %d",
            label,
            report.num_skipped,
            report.records,
            report.loaded,
        )
    return instances, report


def save_jsonl(instances: Iterable[Instance], path: str | Path) -> None:
    """Write instances as memalpha JSONL, atomically (:func:`~memalpha.atomic_file.write_atomically`)."""
    write_atomically(path, (json.dumps(item.to_dict(), ensure_ascii=False) + "\n" for item in instances))


# ---------------------------------------------------------------------------
# reading records
# ---------------------------------------------------------------------------


def read_records(source: str | Path, split: str | None = None) -> tuple[str, list[RawRecord]]:
    """Read the raw records of ``source``; returns a label naming where they came from and the records."""
    path = Path(source).expanduser()
    if path.is_dir():
        if is_saved_dataset(path):
            return str(path), _records_from_saved_dataset(path, split)
        data_file = select_data_file(path, split)
        return str(data_file), _records_from_file(data_file)
    if path.is_file():
        return str(path), _records_from_file(path)
    check_source(source)
    return _records_from_hub(str(source), split)


def check_source(source: str | Path) -> None:
    """Refuse a data source that is neither an existing file or folder nor shaped like a hub
    dataset name, before anything is loaded."""
    path = Path(source).expanduser()
    text = str(source)
    if path.exists() or (_HUB_NAME.match(text) and path.suffix.lower() not in DATA_SUFFIXES):
        return
    raise DataValidationError(text, "no such file or folder (and not a hub dataset name like 'owner/name')")


def list_data_files(folder: str | Path) -> list[Path]:
    """The data files (``.jsonl``, ``.ndjson``, ``.json``, ``.parquet``) below ``folder``, sorted."""
    folder = Path(folder)
    return sorted(
        p
        for p in folder.rglob("*")
        if p.is_file()
        and p.suffix.lower() in DATA_SUFFIXES
        and not any(part.startswith(".") for part in p.relative_to(folder).parts)
        and p.name not in ("dataset_info.json", "state.json", "dataset_dict.json")
    )


def select_data_file(folder: Path, split: str | None) -> Path:
    """The data file of ``split`` in a plain folder (its name starts with the split), or its only data
    file."""
    files = list_data_files(folder)
    if not files:
        raise DataValidationError(str(folder), f"no data file ({', '.join(DATA_SUFFIXES)}) in this folder")
    if split is None:
        if len(files) == 1:
            return files[0]
        names = ", ".join(str(p.relative_to(folder)) for p in files)
        raise DataValidationError(str(folder), f"several data files ({names}); choose one with split=")
    pattern = re.compile(rf"^{re.escape(split)}(?:[-_.].*)?$", re.IGNORECASE)
    matches = [p for p in files if pattern.match(p.name)]
    if len(matches) != 1:
        names = ", ".join(str(p.relative_to(folder)) for p in files)
        found = "no" if not matches else "more than one"
        raise DataValidationError(str(folder), f"{found} data file for split {split!r} among: {names}")
    return matches[0]


def _records_from_file(path: Path) -> list[RawRecord]:
    suffix = path.suffix.lower()
    try:
        if suffix in (".jsonl", ".ndjson"):
            return _records_from_jsonl(path)
        if suffix == ".json":
            return _records_from_json(path)
    except UnicodeDecodeError as exc:
        expected = f"{suffix[1:].upper()} records"
        raise DataValidationError(str(path), f"not UTF-8 text ({exc.reason}); expected {expected}") from exc
    if suffix == ".parquet":
        return _records_from_parquet(path)
    raise DataValidationError(str(path), f"unsupported file type {suffix!r}; expected one of {DATA_SUFFIXES}")


def _records_from_jsonl(path: Path) -> list[RawRecord]:
    records: list[RawRecord] = []
    with open(path, encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            index = len(records)
            try:
                records.append(RawRecord(index, json.loads(line)))
            except json.JSONDecodeError as exc:
                error = DataValidationError(
                    str(path),
                    f"line {line_no} is not valid JSON ({exc.msg} at column {exc.colno})",
                    index=index,
                )
                records.append(RawRecord(index, error=error))
    return records


def _records_from_json(path: Path) -> list[RawRecord]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DataValidationError(str(path), f"not valid JSON ({exc.msg} at line {exc.lineno})") from exc
    if isinstance(data, dict) and isinstance(data.get("instances"), list):
        data = data["instances"]
    if not isinstance(data, list):
        raise DataValidationError(
            str(path), "expected a JSON list of records (or an object with an 'instances' list)"
        )
    return [RawRecord(i, value) for i, value in enumerate(data)]


def _records_from_parquet(path: Path) -> list[RawRecord]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises several types for unreadable files
        raise DataValidationError(str(path), f"cannot read parquet ({type(exc).__name__}: {exc})") from exc
    return [RawRecord(i, value) for i, value in enumerate(table.to_pylist())]


def is_saved_dataset(folder: Path) -> bool:
    return (folder / "dataset_dict.json").is_file() or (
        (folder / "state.json").is_file() and (folder / "dataset_info.json").is_file()
    )


def _records_from_saved_dataset(folder: Path, split: str | None) -> list[RawRecord]:
    import datasets

    try:
        loaded = datasets.load_from_disk(str(folder))
    except Exception as exc:  # datasets raises several types for unreadable folders; the load stops here
        raise DataValidationError(
            str(folder), f"cannot load dataset folder ({type(exc).__name__}: {exc})"
        ) from exc
    dataset = _pick_split(loaded, split, str(folder))
    return [RawRecord(i, value) for i, value in enumerate(dataset.to_list())]


def _records_from_hub(name: str, split: str | None) -> tuple[str, list[RawRecord]]:
    import datasets

    try:
        loaded = datasets.load_dataset(name, split=split)
    except Exception as exc:  # network, auth and missing-name errors come as several types; the load stops
        raise DataValidationError(
            name,
            f"cannot load hub dataset ({type(exc).__name__}: {exc}); the machine may be offline "
            "(HF_HUB_OFFLINE) or the name or split wrong",
        ) from exc
    dataset = _pick_split(loaded, split, name)
    label = f"{name}[{split}]" if split else name
    return label, [RawRecord(i, value) for i, value in enumerate(dataset.to_list())]


def _pick_split(loaded: Any, split: str | None, label: str) -> Any:
    if not hasattr(loaded, "keys"):  # a single Dataset
        return loaded
    names = list(loaded.keys())
    if split is None:
        if len(names) == 1:
            return loaded[names[0]]
        raise DataValidationError(label, f"several splits ({', '.join(names)}); choose one with split=")
    if split not in names:
        raise DataValidationError(label, f"no split {split!r}; available: {', '.join(names)}")
    return loaded[split]


# ---------------------------------------------------------------------------
# layouts
# ---------------------------------------------------------------------------


def detect_layout(records: list[RawRecord], label: str) -> str:
    """Guess the layout from the fields of the first readable record."""
    for raw in records:
        if raw.error is None and isinstance(raw.value, dict):
            keys = set(raw.value)
            if "questions_and_answers" in keys:
                return "memalpha"
            if "haystack_sessions" in keys:
                return "longmemeval"
            if "conversation" in keys and "qa" in keys:
                return "locomo"
            if is_memory_record(raw.value):
                return "memories"
            if "context" in keys and ("answers" in keys or "questions" in keys) and "chunks" not in keys:
                return "memoryagentbench"
            return "jsonl"
    raise DataValidationError(label, "cannot detect the layout: no readable record (pass layout=)")


def _record_parser(
    layout: str, *, tokenizer: Any, chunk_tokens: int | None
) -> Callable[[Any, str, int], Instance]:
    if layout == "jsonl":
        return lambda record, file, index: parse_record(record, file=file, index=index)
    if layout == "memalpha":
        return parse_memalpha_record
    if layout == "longmemeval":
        return parse_longmemeval_record
    if layout == "memories":
        return parse_memory_record
    if chunk_tokens is None:
        raise ValueError(
            f"data.load.chunk_tokens: null cuts the {layout} layout's chunks to model.rollout's prompt "
            "budget, which is not known here (no model linked): set a number"
        )
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    resolved: list[Any] = []
    if layout == "locomo":

        def count(text: str) -> int:
            if not resolved:
                resolved.append(_named_tokenizer(tokenizer))
            return count_tokens(text, resolved[0])

        unit = "tokens" if tokenizer is not None else "white-space words"
        return lambda record, file, index: parse_locomo_record(
            record, file, index, count=count, chunk_tokens=chunk_tokens, unit=unit
        )
    # memoryagentbench, the last layout (load_instances has checked the name)

    def parse(record: Any, file: str, index: int) -> Instance:
        if not resolved:
            resolved.append(_resolve_tokenizer(tokenizer, file))
        return parse_memoryagentbench_record(
            record, file, index, tokenizer=resolved[0], chunk_tokens=chunk_tokens
        )

    return parse


def _resolve_tokenizer(tokenizer: Any, label: str) -> Any:
    if tokenizer is None:
        raise DataValidationError(
            label,
            "the memoryagentbench layout is chunked by tokens: pass tokenizer= (a tokenizer or a model name)",
        )
    return _named_tokenizer(tokenizer)


def _named_tokenizer(tokenizer: Any) -> Any:
    """``tokenizer``, loaded when it is given by name or path."""
    if isinstance(tokenizer, (str, Path)):
        from memalpha.lm.core.embedded import load_tokenizer

        return load_tokenizer(str(tokenizer))
    return tokenizer


def _start_checker(record: Any, file: str, index: int, id_keys: tuple[str, ...]) -> RecordChecker:
    check = RecordChecker(file, index)
    if not isinstance(record, dict):
        check.fail(None, f"expected an object, got {type(record).__name__}")
    for key in id_keys:
        if isinstance(record.get(key), (str, int)) and not isinstance(record.get(key), bool):
            check.instance_id = str(record[key])
            break
    return check


def parse_memalpha_record(record: Any, file: str, index: int) -> Instance:
    """One row of the official Mem-α parquet layout as an :class:`Instance`.

    ``prompt`` and every column outside the schema go to ``metadata`` (``metadata`` keys win);
    ``num_chunks`` / ``num_questions``, when present, must agree with the decoded lists.
    """
    check = _start_checker(record, file, index, ("instance_id",))
    instance_id = check.identifier(check.require(record, "instance_id"), "instance_id", coerce_int=True)
    data_source = check.string(check.require(record, "data_source"), "data_source")
    chunks = check.chunks(check.json_value(check.require(record, "chunks"), "chunks"))
    qa_raw = check.json_value(check.require(record, "questions_and_answers"), "questions_and_answers")
    questions = check.questions(qa_raw, "questions_and_answers", coerce_numbers=True)
    metadata_raw = record.get("metadata")
    metadata = (
        {} if metadata_raw is None else check.mapping(check.json_value(metadata_raw, "metadata"), "metadata")
    )
    for count_field, actual in (("num_chunks", len(chunks)), ("num_questions", len(questions))):
        declared = record.get(count_field)
        if declared is None:
            continue
        if not isinstance(declared, int) or isinstance(declared, bool):
            check.fail(count_field, f"expected an integer, got {type(declared).__name__}")
        if declared != actual:
            check.fail(count_field, f"says {declared} but the decoded list has {actual}")
    known = {
        "instance_id",
        "data_source",
        "chunks",
        "questions_and_answers",
        "metadata",
        "num_chunks",
        "num_questions",
    }
    extra = {k: v for k, v in record.items() if k not in known and v is not None}
    return Instance(instance_id, data_source, list(chunks), questions, {**extra, **metadata})


def parse_memoryagentbench_record(
    record: Any, file: str, index: int, *, tokenizer: Any, chunk_tokens: int = DEFAULT_CHUNK_TOKENS
) -> Instance:
    """One MemoryAgentBench record: its ``context`` cut into token chunks, ``questions`` paired with
    ``answers``.

    ``data_source`` is ``metadata.source``; the instance id is the record's ``instance_id`` or ``id``,
    else ``metadata.id``, else ``{source}-{index}``.
    """
    check = _start_checker(record, file, index, ("instance_id", "id"))
    metadata = check.mapping(check.json_value(check.require(record, "metadata"), "metadata"), "metadata")
    source = check.string(check.require(metadata, "source", "metadata.source"), "metadata.source")
    if "instance_id" in record or "id" in record:
        key = "instance_id" if "instance_id" in record else "id"
        instance_id = check.identifier(check.require(record, key), key, coerce_int=True)
    elif metadata.get("id") is not None:
        instance_id = check.identifier(metadata["id"], "metadata.id", coerce_int=True)
    else:
        instance_id = f"{source}-{index}"
    check.instance_id = instance_id
    context = check.string(check.require(record, "context"), "context")
    questions = check.sequence(check.json_value(check.require(record, "questions"), "questions"), "questions")
    answers = check.sequence(check.json_value(check.require(record, "answers"), "answers"), "answers")
    if len(questions) != len(answers):
        check.fail("answers", f"{len(answers)} answers for {len(questions)} questions")
    if not questions:
        check.fail("questions", "empty question list (an instance needs at least one question)")
    qas = [
        QA(check.string(q, f"questions[{j}]"), check.answer(a, f"answers[{j}]", coerce_numbers=True))
        for j, (q, a) in enumerate(zip(questions, answers))
    ]
    try:
        chunks = chunk_by_tokens(context, tokenizer, chunk_tokens)
    except TypeError as exc:
        check.fail("context", str(exc))
    extra = {
        k: v
        for k, v in record.items()
        if k not in ("context", "questions", "answers", "metadata", "instance_id", "id")
    }
    meta = {**extra, **metadata, "chunk_tokens": chunk_tokens}
    return Instance(instance_id, source, chunks, qas, meta)
