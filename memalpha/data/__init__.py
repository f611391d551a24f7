"""Instances (chunks to memorise + questions), their loaders and the synthetic memory tasks.

>>> from memalpha.data import load_instances, save_jsonl
>>> from memalpha.data.synthetic import generate_synthetic
"""

from memalpha.data.chunking import DEFAULT_CHUNK_TOKENS, chunk_by_tokens, count_tokens
from memalpha.data.loaders import (
    LAYOUTS,
    LoadReport,
    detect_layout,
    list_data_files,
    load_instances,
    load_instances_with_report,
    save_jsonl,
)
from memalpha.data.schema import QA, DataValidationError, Instance, parse_record
from memalpha.data.wrapping import WRAP_STYLES, unwrap_chunk, wrap_chunk, wrap_chunks

__all__ = [
    "DEFAULT_CHUNK_TOKENS",
    "LAYOUTS",
    "QA",
    "WRAP_STYLES",
    "DataValidationError",
    "Instance",
    "LoadReport",
    "chunk_by_tokens",
    "count_tokens",
    "detect_layout",
    "list_data_files",
    "load_instances",
    "load_instances_with_report",
    "parse_record",
    "save_jsonl",
    "unwrap_chunk",
    "wrap_chunk",
    "wrap_chunks",
]
