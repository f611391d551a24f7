"""docs/architecture.md's "The files one step opens" stays true to the code: a real GRPO step (two
optimiser steps of the tiny model under Lightning, the KL reference and old log-probs on) is traced,
and the files whose functions the step's own files call must be exactly the page's list, at most 15.

The step's own files are ``train/module.py``, ``train/policy_module.py`` and ``train/step.py``: a
new call from them into another file of the package, or a listed file the step stopped calling,
fails here until the page says so.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from lightning.pytorch import Trainer
from test_nonfinite import grpo

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "memalpha"
STEP_FILES = ("memalpha/train/module.py", "memalpha/train/policy_module.py", "memalpha/train/step.py")
_SECTION = re.compile(r"<!-- step-walk -->\n(.*?)<!-- /step-walk -->", re.DOTALL)
_ROW = re.compile(r"^\|\s*\[`(memalpha/[\w/]+\.py)`\]", re.MULTILINE)


def listed_walk() -> list[str]:
    """The files of the page's step-walk table, in its order."""
    section = _SECTION.search((REPO / "docs" / "architecture.md").read_text())
    assert section is not None, "docs/architecture.md lost its <!-- step-walk --> table"
    return _ROW.findall(section.group(1))


def traced_walk(module, data, tmp_path) -> set[str]:
    """The package files a training step runs code of, called from the step's own files (and those)."""
    files: set[str] = set()
    training_step = type(module)._training_step

    def relative(code_file: str) -> str | None:
        path = Path(code_file)
        return str(path.relative_to(REPO)) if path.is_relative_to(PACKAGE) else None

    def package_caller(frame) -> str | None:
        """The package file of the nearest caller in the package, through library frames (a
        context manager, a ``torch.no_grad`` wrapper), but not through Lightning's: the DataModule's
        stream is what Lightning's fetcher calls when the step asks for a round."""
        frame = frame.f_back
        while frame is not None and relative(frame.f_code.co_filename) is None:
            if f"{os.sep}lightning{os.sep}" in frame.f_code.co_filename:
                return None
            frame = frame.f_back
        return None if frame is None else relative(frame.f_code.co_filename)

    def profile(frame, event, arg) -> None:
        if event != "call":
            return
        callee = relative(frame.f_code.co_filename)
        if callee is None:
            return
        caller = package_caller(frame)
        if caller in STEP_FILES:
            files.update((callee, caller))

    def traced(self, dataloader_iter):
        sys.setprofile(profile)
        try:
            return training_step(self, dataloader_iter)
        finally:
            sys.setprofile(None)

    module._training_step = traced.__get__(module)
    trainer = Trainer(
        accelerator="cpu", devices=1, max_steps=2, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0, num_sanity_val_steps=0,
        default_root_dir=str(tmp_path),
    )
    trainer.fit(module, datamodule=data, weights_only=False)
    assert trainer.global_step == 2
    return files


def test_the_files_one_step_opens_are_the_pages_list(tiny_model_dir, tmp_path):
    listed = listed_walk()
    assert len(listed) == len(set(listed)) and len(listed) <= 15, listed
    module, data = grpo(tiny_model_dir, tmp_path, update={"kl_coef": 0.01, "ppo_epochs": 2})
    traced = traced_walk(module, data, tmp_path)
    assert traced == set(listed), (
        f"the step calls files the page does not list: {sorted(traced - set(listed))}; the page lists files"
        f" the step does not call: {sorted(set(listed) - traced)}"
    )
