"""No script in ``experiments/`` imports another (issue 75, item 5): what scripts share lives in the
measuring kit, ``experiments/lab/memalpha_lab/``, under a name that says what it holds, so each script
is a command line over ``memalpha`` and ``memalpha_lab`` alone. A script that imports a sibling
script (its folder is on ``sys.path`` when it runs), imports relatively, or puts a folder of
``experiments/`` on ``sys.path`` fails here. A script may import itself (``gpu_fit_check.py`` does, so
that its config names its callbacks by a module path).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXPERIMENTS = REPO / "experiments"
LAB = EXPERIMENTS / "lab"

_EXPERIMENTS_ON_PATH = re.compile(r"sys\.path(\.insert|\.append|\.extend|\[)[^\n]*(experiments|__file__)")


def scripts(root: Path = EXPERIMENTS) -> list[Path]:
    """Every ``.py`` under ``root`` outside its measuring kit (``lab/``)."""
    return sorted(path for path in root.rglob("*.py") if not path.is_relative_to(root / "lab"))


def script_imports(source: str, others: set[str]) -> list[str]:
    """The imports of ``source`` (anywhere in it, a function's deferred import included) that name a
    script of ``others``, the ``experiments`` folder, or a module relative to the file; and its lines
    that put a script folder on ``sys.path``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                found.append(f"from {'.' * node.level}{node.module or ''} import ...")
                continue
            names = [node.module or ""]
        else:
            continue
        found += [f"import {name}" for name in names if name.split(".")[0] in others | {"experiments"}]
    return found + [
        f"sys.path: {line.strip()}" for line in source.splitlines() if _EXPERIMENTS_ON_PATH.search(line)
    ]


def test_no_script_imports_another_script():
    paths = scripts()
    names = {path.stem for path in paths}
    assert {"decisive", "control_arms", "bench_update"} <= names, "the scripts were not found"
    found = {
        str(path.relative_to(REPO)): lines
        for path in paths
        if (lines := script_imports(path.read_text(encoding="utf-8"), names - {path.stem}))
    }
    assert found == {}, "scripts share code through experiments/lab/memalpha_lab, never through each other"


def test_the_rule_sees_each_way_of_importing_a_script(tmp_path):
    (tmp_path / "lab" / "kit").mkdir(parents=True)
    (tmp_path / "lab" / "kit" / "shared.py").write_text('"""A kit module."""\n')
    (tmp_path / "studies").mkdir()
    for name in ("study", "helper"):
        (tmp_path / "studies" / f"{name}.py").write_text('"""A script."""\n')
    names = {path.stem for path in scripts(tmp_path)}
    assert names == {"study", "helper"}
    source = (
        "import os\nfrom kit.shared import x\nimport helper\nfrom helper import run as r\n"
        "from . import sibling\nimport sys\nsys.path.insert(0, str(Path(__file__).parent))\n\n"
        "def f():\n    import study.more\n"
    )
    path_line = "sys.path: sys.path.insert(0, str(Path(__file__).parent))"
    own = ["import helper", "import helper", "from . import ...", path_line]
    # read as study.py's source, its import of itself passes
    assert script_imports(source, names - {"study"}) == own
    assert script_imports(source, names) == [*own[:3], "import study.more", path_line]
