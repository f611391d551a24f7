"""Memory files: saved and loaded back byte for byte, the id counter kept, and every file this
memalpha cannot read refused in one line with nothing overwritten (memalpha/inference/memory_file.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memalpha.inference.memory_file import (
    FORMAT_VERSION,
    MemoryFileError,
    load_memory,
    memory_json,
    save_memory,
)
from memalpha.memory.store import Memory, counter_for_id, id_for_counter


def filled_memory(seed: int = 7) -> Memory:
    memory = Memory(core_token_limit=40, seed=seed)
    memory.core = "Ada lives in Lisbon and works on compilers. Ünïcödé stays as it is: 東京."
    first = memory.insert("semantic", "Ada's favourite language is OCaml.")
    memory.insert("semantic", "Ada has a cat named Pixel.")
    memory.insert("episodic", "2024-03-02: Ada moved to Lisbon.")
    memory.delete("semantic", first.id)  # the counter keeps moving past a freed id
    memory.core = "word " * 100  # cut at the cap, with its marker
    return memory


def test_save_then_load_gives_the_same_bytes_and_the_same_next_id(tmp_path):
    memory = filled_memory()
    path = save_memory(memory, tmp_path / "m.json")
    loaded = load_memory(path)
    assert loaded.to_dict() == memory.to_dict()
    again = save_memory(loaded, tmp_path / "again.json")
    assert again.read_bytes() == path.read_bytes()
    assert path.read_text(encoding="utf-8") == memory_json(memory)
    assert loaded.insert("episodic", "new").id == memory.insert("episodic", "new").id
    assert json.loads(path.read_text(encoding="utf-8"))["format"] == f"memalpha.memory/{FORMAT_VERSION}"


def test_a_loaded_core_is_kept_as_stored_not_cut_again(tmp_path):
    memory = filled_memory()
    path = save_memory(memory, tmp_path / "m.json")
    # a counter of three tokens a word: the stored core is over its cap under it
    assert load_memory(path, token_counter=lambda text: 3 * len(text.split())).core == memory.core


def test_ids_invert_for_every_width():
    for seed in (0, 3, 2**31 - 1):
        for counter in (0, 1, 65535, 65536, 65536 + 16**5 - 1, 65536 + 16**5, 10**9):
            assert counter_for_id(seed, id_for_counter(seed, counter)) == counter
    assert counter_for_id(0, "zzzz") is None and counter_for_id(0, "abc") is None


def write(tmp_path, data) -> str:
    path = tmp_path / "memory.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
    return str(path)


def good_dict() -> dict:
    return filled_memory().to_dict()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: "{not json", "is not a memalpha memory file (not valid JSON: "),
        (lambda d: [d], "is not a memalpha memory file (expected a JSON object, got list)"),
        (lambda d: {**d, "format": "other/1"},
         'is not a memalpha memory file (no "format": "memalpha.memory/1")'),
        (lambda d: {**d, "format": "memalpha.memory/2"},
         "was written by a newer memalpha (memory format version 2; this memalpha reads up to version 1)"),
        (lambda d: {**d, "extra": 1}, "field 'extra': unknown in memory format version 1"),
        (lambda d: {k: v for k, v in d.items() if k != "seed"}, "field 'seed': missing"),
        (lambda d: {**d, "core": 3}, "field 'core': expected a string, got int"),
        (lambda d: {**d, "id_counter": -1}, "field 'id_counter': expected an integer >= 0, got -1"),
        (lambda d: {**d, "core_token_limit": True}, "field 'core_token_limit': expected an integer >= 1"),
        (lambda d: {**d, "semantic": "x"}, "field 'semantic': expected a list of entries, got str"),
        (lambda d: {**d, "semantic": [{"id": "a"}]}, "field 'semantic[0]': expected an object with exactly"),
        (lambda d: {**d, "episodic": [{"id": d["episodic"][0]["id"], "content": 5}]},
         "field 'episodic[0].content': expected a string, got int"),
        (lambda d: {**d, "episodic": [{"id": "ffff", "content": "x"}]},
         "field 'episodic[0].id': 'ffff' is not an id this memory handed out (seed 7, id_counter 3)"),
        (lambda d: {**d, "episodic": d["episodic"] * 2}, "field 'episodic[1].id': "),
        (lambda d: {**d, "core_token_limit": 1}, "field 'core_token_limit': core_token_limit=1 is too small"),
    ],
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_a_file_this_memalpha_cannot_read_is_one_line_and_nothing_is_overwritten(tmp_path, change, message):
    path = write(tmp_path, change(good_dict()))
    before = Path(path).read_bytes()
    with pytest.raises(MemoryFileError) as error:
        load_memory(path)
    text = str(error.value)
    assert text.startswith(path + ": ") and message in text and "\n" not in text
    with pytest.raises(MemoryFileError, match="it exists and "):
        save_memory(filled_memory(), path)
    assert Path(path).read_bytes() == before


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(MemoryFileError, match="no such memory file"):
        load_memory(tmp_path / "nope.json")


def test_saving_over_an_older_copy_of_a_memory_replaces_it(tmp_path):
    memory = filled_memory()
    path = save_memory(Memory(seed=1), tmp_path / "m.json")
    save_memory(memory, path)
    assert load_memory(path).to_dict() == memory.to_dict()
