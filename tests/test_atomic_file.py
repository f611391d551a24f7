"""memalpha.atomic_file: the old file or the new one, never half of one, and no temporary file left."""

from __future__ import annotations

import os
import stat

import pytest

from memalpha.atomic_file import write_atomically


def test_a_write_replaces_the_file_with_the_usual_mode_and_counts_its_pieces(tmp_path):
    target = tmp_path / "sub" / "a.jsonl"
    assert write_atomically(target, ["{}\n", "{}\n"]) == 2
    assert target.read_text() == "{}\n{}\n"
    umask = os.umask(0o022)
    os.umask(umask)
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~umask  # not a temporary file's 0600
    assert [p.name for p in target.parent.iterdir()] == ["a.jsonl"]


def test_a_write_that_fails_midway_leaves_the_old_file_and_no_temporary_one(tmp_path):
    target = tmp_path / "a.jsonl"
    target.write_text("old\n")

    def pieces():
        yield "new line\n"
        raise RuntimeError("the producer broke")

    with pytest.raises(RuntimeError, match="the producer broke"):
        write_atomically(target, pieces())
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["a.jsonl"]
