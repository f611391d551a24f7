"""Every row of docs/troubleshooting.md's first table: the bad input fails with the documented line.

Each command runs in this process (as ``memalpha`` would, through :func:`memalpha.cli.main`)
from a folder holding the repository's ``configs/`` and the files the page names. The check is
the page's own claim: the command fails, its last line of error output holds the message, and
no traceback is printed. None of these commands gets as far as loading a model.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
from pathlib import Path

import lightning.pytorch  # noqa: F401 - its log handler must bind the session's stderr, not one test's capsys
import pytest
import torch

from memalpha.cli import main

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "troubleshooting.md"
ROW = re.compile(r"^\| `(memalpha [^`]+)` \| `(.+)` \|$")


def documented_rows() -> list[tuple[str, str]]:
    section = PAGE.read_text(encoding="utf-8").split("## Before a run", 1)[1].split("\n## ", 1)[0]
    rows = [match.groups() for line in section.splitlines() if (match := ROW.match(line))]
    assert len(rows) >= 20, f"{PAGE} lost its table: {len(rows)} rows"
    return rows


def write_inputs(folder: Path) -> None:
    """The files the page's commands name, and the repository's configs."""
    shutil.copytree(REPO / "configs", folder / "configs")
    (folder / "garbage.jsonl").write_bytes(os.urandom(4096) + b"\xff\xfe")
    (folder / "notes.txt").write_text("not a checkpoint\n")
    torch.save({"state_dict": {}, "memalpha_module": "SFTModule", "global_step": 3}, folder / "sft.ckpt")
    torch.save({"state_dict": {}, "memalpha_module": "GRPOModule", "global_step": 1, "hyper_parameters": {
        "model": "smollm2-135m-instruct",
        "lora": {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": "all-linear"},
    }}, folder / "fit.ckpt")
    (folder / "empty.txt").write_text("")
    (folder / "long.txt").write_text("word " * 3000)


@pytest.mark.parametrize(("command", "message"), documented_rows(), ids=lambda value: value[:70])
def test_documented_bad_input_gets_its_message(command, message, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    write_inputs(tmp_path)
    monkeypatch.chdir(tmp_path)
    args = shlex.split(command)[1:]
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    code = exit_info.value.code
    captured = capsys.readouterr()
    printed = captured.err + (code if isinstance(code, str) else "")
    assert code not in (0, None), f"{command} did not fail"
    last = printed.strip().splitlines()[-1]
    assert message in last, f"{command}\n  printed: {last}\n  page says: {message}"
    assert "Traceback" not in printed
