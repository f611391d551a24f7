"""Tests import nothing from ``experiments/`` (issue 40, item 4): what a test checks directly lives
in the package (``experiments/lab/memalpha_lab/`` for the experiments' measuring kit), and a script
is tested by
running it in a child process (``tests/script_probe.py``). A test file that imports a script's
module, or puts a folder of ``experiments/`` on ``sys.path``, fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

from source_imports import absolute_imports

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"
THIS = Path(__file__).name  # its own sample lines are strings
SCRIPT_MODULES = {path.stem for path in (REPO / "experiments").rglob("*.py")}

_EXPERIMENTS_ON_PATH = re.compile(r"sys\.path(\.insert|\.append|\.extend|\[)[^\n]*experiments", re.IGNORECASE)


def offences(path: Path) -> list[str]:
    """The script modules ``path`` imports (anywhere in the file) and its sys.path lines naming
    experiments."""
    text = path.read_text(encoding="utf-8")
    found = [f"import {name}" for name in absolute_imports(text)
             if name.split(".")[0] in SCRIPT_MODULES or name.split(".")[0] == "experiments"]
    found += [f"sys.path: {line.strip()}" for line in text.splitlines() if _EXPERIMENTS_ON_PATH.search(line)]
    return found


def test_no_test_imports_a_script_or_puts_experiments_on_the_path():
    offending = {path.name: offences(path) for path in sorted(TESTS.glob("*.py")) if path.name != THIS}
    found = {name: lines for name, lines in offending.items() if lines}
    assert found == {}, "tests must run experiments/ scripts as subprocesses, or import from memalpha_lab"


def test_the_rule_sees_a_script_import_and_a_path_insert(tmp_path):
    sample = tmp_path / "test_sample.py"
    sample.write_text(
        'import sys\nsys.path.insert(0, "experiments/bench")\n\n\ndef f():\n    import bench_scale\n'
    )
    assert offences(sample) == ["import bench_scale", 'sys.path: sys.path.insert(0, "experiments/bench")']
