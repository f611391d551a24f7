"""Tests import nothing from ``experiments/`` (issue 40, item 4): what a test checks directly lives
in the package (``memalpha/lab/`` for the experiments' measuring kit), and a script is tested by
running it as a subprocess. A test file that imports a script's module, or puts a folder of
``experiments/`` on ``sys.path``, fails here.

:data:`NOT_YET` lists the files that still do, each to be turned into subprocess runs or moved
into the package; the list may only shrink (a listed file that no longer imports is an error too).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"
THIS = Path(__file__).name  # its own sample lines are strings
SCRIPT_MODULES = {path.stem for path in (REPO / "experiments").rglob("*.py")}

# test file -> why it still imports a script (spies on in-process calls, or a script's config builders)
NOT_YET: dict[str, str] = {}

_EXPERIMENTS_ON_PATH = re.compile(r"sys\.path(\.insert|\.append|\.extend|\[)[^\n]*experiments", re.IGNORECASE)


def offences(path: Path) -> list[str]:
    """The script modules ``path`` imports (anywhere in the file) and its sys.path lines naming experiments."""
    text = path.read_text(encoding="utf-8")
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found += [f"import {name}" for name in names
                  if name.split(".")[0] in SCRIPT_MODULES or name.split(".")[0] == "experiments"]
    found += [f"sys.path: {line.strip()}" for line in text.splitlines() if _EXPERIMENTS_ON_PATH.search(line)]
    return found


def test_no_test_imports_a_script_or_puts_experiments_on_the_path():
    offending = {path.name: offences(path) for path in sorted(TESTS.glob("*.py")) if path.name != THIS}
    new = {name: found for name, found in offending.items() if found and name not in NOT_YET}
    assert new == {}, "tests must run experiments/ scripts as subprocesses, or import from memalpha.lab"


def test_the_not_yet_list_only_shrinks():
    cleaned = sorted(name for name in NOT_YET if not offences(TESTS / name))
    assert cleaned == [], f"no longer importing from experiments/: remove from NOT_YET: {cleaned}"


def test_the_rule_sees_a_script_import_and_a_path_insert(tmp_path):
    sample = tmp_path / "test_sample.py"
    sample.write_text('import sys\nsys.path.insert(0, "experiments/bench")\n\n\ndef f():\n    import bench_scale\n')
    assert offences(sample) == ["import bench_scale", 'sys.path: sys.path.insert(0, "experiments/bench")']
