"""A run prints its stage lines, the progress bar and the tables, not the dependencies' notices
(issue 40, item 7): known harmless warnings are hidden in one place
(memalpha/train/known_warnings.py), anything else still shows, and a config that is not valid YAML
is reported with its file, line and column."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from test_training import write_config

from memalpha.train.known_warnings import LOG_RECORDS, PYTHON_WARNINGS, silence_known_warnings

WARNING_LINE = re.compile(r"warning|warn\(|deprecat|experimental|tip:|failed to load", re.IGNORECASE)


def test_a_short_fit_prints_no_warning_line(tmp_path, tiny_model_dir):
    config = write_config(tmp_path, tiny_model_dir, max_steps=1, instances_per_step=1)
    memalpha = str(Path(sys.executable).with_name("memalpha"))
    # what a user sees: Python's default filters (deprecations in library code stay hidden)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"} | {"HF_HUB_OFFLINE": "1"}
    run = subprocess.run(
        [memalpha, "fit", "--config", str(config), "--trainer.val_check_interval", "1"],
        capture_output=True, text=True, env=env, timeout=600, check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    lines = (run.stdout + run.stderr).replace("\r", "\n").splitlines()
    noisy = [line for line in lines if WARNING_LINE.search(line)]
    assert noisy == [], "\n".join(noisy)
    assert any(line.startswith("ALL ") for line in lines)  # the validation table is there


def test_only_the_listed_warnings_are_hidden(caplog):
    silence_known_warnings()
    silence_known_warnings()  # twice: still one filter per logger
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        silence_known_warnings()
        warnings.warn(PYTHON_WARNINGS[2].message + " ... Here be dragons.", UserWarning, stacklevel=1)
        warnings.warn("memalpha: rollout round 3: 8 of 8 reader answers failed", UserWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["memalpha: rollout round 3: 8 of 8 reader answers failed"]
    for name, known in LOG_RECORDS.items():
        logger = logging.getLogger(name)
        assert len(logger.filters) == 1
        with caplog.at_level(logging.INFO, logger=name):
            logger.warning(known[0].message + " and more")
            logger.warning("something else went wrong")
        assert [r.getMessage() for r in caplog.records if r.name == name] == ["something else went wrong"]
        caplog.clear()
    assert all(k.reason for k in PYTHON_WARNINGS) and all(k.reason for ks in LOG_RECORDS.values() for k in ks)


@pytest.mark.parametrize("command", ["fit", "sft"])
def test_a_yaml_syntax_error_names_the_file_and_line(tmp_path, command):
    from memalpha.cli import main

    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer:\n  max_steps: 2\n model: [\n")
    with pytest.raises(SystemExit) as stopped:
        main([command, "--config", str(bad)])
    message = str(stopped.value.code)
    assert message.startswith(f"memalpha {command}: error: {bad}, line 3, column 2: not valid YAML: "), (
        message
    )
    assert "<unicode string>" not in message and "\n" not in message
