"""What decides the records a run writes, as a short digest: a ``memalpha predict`` output or a
journal of ``memalpha validate`` resumes only with the same (:mod:`memalpha.train.predict_file`,
:mod:`memalpha.train.validation_journal`)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

ROLLOUT_KEPT_OUT = ("group_size", "generation_batch_size", "backend", "vllm", "baseline")
"""Rollout settings that change how fast a record is made, not what it holds (and the baseline,
which the digest holds only when it names one, so an agent's digest is what it was before there
were baselines)."""
READER_KEPT_OUT = ("batch_size", "max_failed_share", "on_failed_round", "openai")


def agent_digest(module: Any, datamodule: Any, ckpt_path: str | None) -> str:
    """A digest of what decides a record: the model, the adapter or checkpoint (its path and its
    bytes, so that one trained again in the same place is another agent), the seed, the rollout,
    reader and answer-metric settings, the baseline in the agent's place, and how the input is cut
    into chunks."""
    hp = module.hparams
    rollout = {k: v for k, v in asdict(module.rollout_settings).items() if k not in ROLLOUT_KEPT_OUT}
    reader = {k: v for k, v in asdict(module.reader_settings).items() if k not in READER_KEPT_OUT}
    reader["openai_model"] = module.reader_settings.openai.model
    reader["adapter_path"] = identified(module.reader_settings.adapter_path)  # the answer agent's bytes
    reward = module.reward_settings
    load, predict = datamodule.load, datamodule.predict
    parts = {
        "model": hp.model,
        "adapter": identified(hp.adapter_path),
        "checkpoint": identified(ckpt_path),
        "seed": hp.seed,
        "rollout": rollout,
        "reader": reader,
        "metrics": {"overrides": reward.metric_overrides, "style": reward.metric_style},
        "chunks": [load.layout, load.chunk_tokens, load.wrap, predict.split],
        **({"baseline": asdict(baseline)} if (baseline := module.rollout_settings.baseline).kind else {}),
    }
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def identified(path: str | None) -> list[str] | None:
    """``path`` resolved, and the SHA-256 of its bytes (of every file under it, by relative path,
    for a folder); None without a path. A path that does not exist keeps its name alone: loading it
    fails with its own message."""
    if path is None:
        return None
    resolved = Path(path).expanduser().resolve()
    if not resolved.exists():
        return [str(resolved)]
    files = sorted(p for p in resolved.rglob("*") if p.is_file()) if resolved.is_dir() else [resolved]
    content = hashlib.sha256()
    for file in files:
        content.update(file.relative_to(resolved).as_posix().encode("utf-8") if file != resolved else b"")
        with open(file, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                content.update(block)
    return [str(resolved), content.hexdigest()[:16]]
