"""Adapters as folders: export a trained adapter as a standard PEFT folder, check a folder that
should be one, and load one frozen beside the policy's own (the KL reference, the answer agent)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from memalpha.lm.core.embedded import EMBEDDED_MODEL_NAME, embedded_model_dir
from memalpha.lm.core.modes import REFERENCE_ADAPTER, holds_adapter, same_adapter_and_trainables


def export_adapter(policy, tokenizer, target: str | os.PathLike) -> Path:
    """Save the adapter (and tokenizer) so ``PeftModel.from_pretrained`` loads it without memalpha.

    Written into a staging folder beside ``target`` and renamed into place, so a crash
    never leaves a half-written adapter where a complete one was.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        # the trained adapter alone: a frozen KL reference or answer agent beside it is not the result
        policy.save_pretrained(staging, selected_adapters=[policy.active_adapter])
        tokenizer.save_pretrained(staging)
        if target.exists():
            backup = target.with_name(f".{target.name}.old")
            shutil.rmtree(backup, ignore_errors=True)
            os.replace(target, backup)
            os.replace(staging, target)
            shutil.rmtree(backup, ignore_errors=True)
        else:
            os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
"""The file names PEFT saves an adapter's weights under."""


def check_adapter_folder(path: str | os.PathLike, option: str) -> Path:
    """``path`` as a folder PEFT can load a LoRA adapter from, or ``ValueError`` in one line naming
    ``option`` and what is missing, before any model loads: the folder, its ``adapter_config.json``
    (a JSON object of a LoRA adapter) and its weights file."""
    folder = Path(path).expanduser()
    config = folder / "adapter_config.json"
    if not config.is_file():
        missing = "no such folder" if not folder.exists() else "no adapter_config.json"
        raise ValueError(f"{option}: {str(path)!r} is not a PEFT adapter folder ({missing})")
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(
            f"{option}: {str(path)!r} is not a PEFT adapter folder"
            f" (adapter_config.json is not valid JSON: {exc})"
        ) from None
    kind = data.get("peft_type") if isinstance(data, dict) else None
    if kind != "LORA":
        raise ValueError(
            f"{option}: {str(path)!r} is not a LoRA adapter folder"
            f" (adapter_config.json has peft_type {kind!r}, memalpha trains LoRA adapters)"
        )
    if not any((folder / name).is_file() for name in ADAPTER_WEIGHTS):
        raise ValueError(
            f"{option}: {str(path)!r} is not a PEFT adapter folder (no {' or '.join(ADAPTER_WEIGHTS)})"
        )
    return folder


def adapter_base(path: str | os.PathLike) -> str | None:
    """The base model an adapter folder names (``base_model_name_or_path``; None when it names none)."""
    data = json.loads((Path(path).expanduser() / "adapter_config.json").read_text(encoding="utf-8"))
    base = data.get("base_model_name_or_path") if isinstance(data, dict) else None
    return base if isinstance(base, str) and base else None


def check_adapter_base(path: str | os.PathLike, model: str, option: str) -> None:
    """``ValueError`` in one line naming ``option`` when the adapter at ``path`` was trained on another
    base than ``model``, before any weight loads: the same base is the same string, the same folder
    (the embedded model's, :func:`~memalpha.lm.core.embedded.embedded_model_dir`, for its name), or a
    folder of the same name (an adapter moved to another machine, or a hub id and its downloaded
    folder). An adapter that names no base is taken as it is."""
    base = adapter_base(path)
    if base is None:
        return
    folder = str(embedded_model_dir()) if model.strip().lower() == EMBEDDED_MODEL_NAME else model
    same = {model, folder}
    if base in same or Path(base).name in {Path(m).name for m in same}:
        return
    if Path(base).expanduser().resolve() == Path(folder).expanduser().resolve():
        return
    raise ValueError(
        f"{option}: {str(path)!r} was trained on the base {base!r}, not on model.model {model!r}: "
        "train it on this base, or set model.model to its base"
    )


def load_frozen_adapter(policy, adapter_path: str | os.PathLike, name: str) -> None:
    """Load ``adapter_path`` into the PEFT ``policy`` as the frozen adapter ``name``; the active
    adapter and which parameters train are left as they were. The base weights are shared: the
    adapter costs only its own LoRA matrices."""
    if holds_adapter(policy, name):
        raise ValueError(f"the policy already holds a '{name}' adapter")
    with same_adapter_and_trainables(policy):
        policy.load_adapter(str(adapter_path), adapter_name=name, is_trainable=False)


def load_reference_adapter(policy, adapter_path: str | os.PathLike) -> None:
    """Load ``adapter_path`` into ``policy`` as the frozen :data:`REFERENCE_ADAPTER`."""
    load_frozen_adapter(policy, adapter_path, REFERENCE_ADAPTER)
