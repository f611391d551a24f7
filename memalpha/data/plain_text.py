"""Plain text and markdown as instances: what ``memalpha predict`` reads besides the data layouts.

A ``.txt`` or ``.md`` file is one instance with no questions (``data_source`` ``text``, its id the
file's path below the folder given, or its name): its text cut by tokens of the policy's
tokenizer into chunks of at most about ``chunk_tokens`` (:func:`~memalpha.data.chunking.chunk_by_tokens`,
``split: tokens``), or one chunk per blank-line-separated block (``split: blank_lines``); a block
longer than ``chunk_tokens`` is cut by tokens too, and a warning says so. A file with no text
to read is refused (:class:`~memalpha.data.schema.DataValidationError` naming it), or skipped and
reported with ``skip_bad``. :func:`load_predict_instances` takes any source: a text file, a folder
of them, or whatever :func:`~memalpha.data.loaders.load_instances` reads.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any, Literal, get_args

from memalpha.data.chunking import chunk_by_tokens
from memalpha.data.loaders import DATA_SUFFIXES, list_data_files, load_instances
from memalpha.data.schema import DataValidationError, Instance
from memalpha.data.wrapping import wrap_chunks

logger = logging.getLogger("memalpha.data")

TextSplit = Literal["tokens", "blank_lines"]
TEXT_SPLITS: tuple[str, ...] = get_args(TextSplit)
TEXT_SUFFIXES = (".txt", ".md")
TEXT_SOURCE = "text"
"""The ``data_source`` of a plain-text instance."""
_BLANK_LINES = re.compile(r"\n[ \t\r\f\v]*\n")


def text_chunks(text: str, tokenizer: Any, chunk_tokens: int, split: str, where: str) -> list[str]:
    """``text`` as chunks (see the module docstring); ``where`` names the text in errors and warnings."""
    if split not in TEXT_SPLITS:
        raise ValueError(f"split must be one of {list(TEXT_SPLITS)}, got {split!r}")
    if not text.strip():
        raise DataValidationError(where, "empty text: there is nothing to read")
    if split == "tokens":
        return chunk_by_tokens(text, tokenizer, chunk_tokens)
    chunks: list[str] = []
    blocks = [block.strip() for block in _BLANK_LINES.split(text) if block.strip()]
    for index, block in enumerate(blocks):
        pieces = chunk_by_tokens(block, tokenizer, chunk_tokens)
        if len(pieces) > 1:
            logger.warning(
                "%s: block %d is longer than data.load.chunk_tokens=%d tokens: read as %d chunks",
                where, index, chunk_tokens, len(pieces),
            )
        chunks.extend(pieces)
    return chunks


def text_instance(
    path: Path, instance_id: str, tokenizer: Any, chunk_tokens: int, split: str, wrap: str | None = None
) -> Instance:
    """The instance of one text file (no questions; ``metadata`` names the file and how it was cut)."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise DataValidationError(str(path), f"not UTF-8 text ({exc.reason})") from None
    chunks = text_chunks(text, tokenizer, chunk_tokens, split, str(path))
    metadata: dict[str, Any] = {"file": str(path), "split": split, "chunk_tokens": chunk_tokens}
    if wrap is not None:
        chunks = wrap_chunks(chunks, wrap)
        metadata["wrap"] = wrap
    return Instance(instance_id, TEXT_SOURCE, chunks, [], metadata)


def list_text_files(folder: Path) -> list[Path]:
    """The ``.txt`` and ``.md`` files below ``folder`` (hidden ones left out), sorted."""
    return sorted(
        p for p in folder.rglob("*")
        if p.is_file() and p.suffix.lower() in TEXT_SUFFIXES
        and not any(part.startswith(".") for part in p.relative_to(folder).parts)
    )  # fmt: skip


def load_predict_instances(
    source: str | Path,
    *,
    tokenizer: Any,
    chunk_tokens: int,
    split: str = "tokens",
    layout: str = "auto",
    wrap: str | None = None,
    skip_bad: bool = False,
) -> list[Instance]:
    """The instances of ``source``: a text file, a folder of text files (one instance each, in
    path order), or any source and layout :func:`~memalpha.data.loaders.load_instances` reads. A
    folder holding both text and data files is refused: which of them to read is the user's call."""
    path = Path(source).expanduser()
    if path.is_file() and path.suffix.lower() in TEXT_SUFFIXES:
        return [text_instance(path, path.name, tokenizer, chunk_tokens, split, wrap)]
    if path.is_dir():
        texts = list_text_files(path)
        if texts and list_data_files(path):
            raise DataValidationError(
                str(path), f"holds both text files ({', '.join(TEXT_SUFFIXES)}) and data files "
                f"({', '.join(DATA_SUFFIXES)}); point it at a folder of one kind or at one file",
            )  # fmt: skip
        if texts:
            instances = []
            for file in texts:
                name = file.relative_to(path).as_posix()
                try:
                    instances.append(text_instance(file, name, tokenizer, chunk_tokens, split, wrap))
                except DataValidationError as exc:
                    if not skip_bad:
                        raise
                    logger.warning("skipping %s", exc)
            if not instances:
                raise DataValidationError(str(path), "no text file with text to read")
            return instances
    instances, _ = load_instances(
        source, layout=layout, tokenizer=tokenizer, chunk_tokens=chunk_tokens, wrap=wrap, skip_bad=skip_bad
    )
    return instances
