"""Every package ``memalpha`` imports is one ``pyproject.toml`` declares: a package that only arrives
with another (numpy with torch, PyYAML with transformers) is one upgrade away from a fresh install
that cannot import memalpha. The optional integrations may import what an extra declares. The
same holds for the measuring kit (``experiments/lab``), which may also import what memalpha requires.
"""

from __future__ import annotations

import re
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest
from source_imports import absolute_imports

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "memalpha"
LAB = REPO / "experiments" / "lab"
LOCAL_EXTRAS = {"dev"}  # the test and lint kit: no module of memalpha may rest on it


def canonical(name: str) -> str:
    """A distribution's name as PEP 503 compares it (``PyYAML`` == ``pyyaml``, ``json_repair`` ==
    ``json-repair``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    """``"rank-bm25==0.2.2"`` -> ``"rank-bm25"``; ``"jsonargparse[signatures]>=4"`` -> ``"jsonargparse"``."""
    return canonical(re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement.strip()).group(0))


def declared(pyproject: Path) -> tuple[set[str], set[str]]:
    """The required distributions, and those an extra other than the local kit adds."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    required = {requirement_name(r) for r in project["dependencies"]}
    extras = {
        requirement_name(r)
        for extra, requirements in project.get("optional-dependencies", {}).items()
        if extra not in LOCAL_EXTRAS
        for r in requirements
    }
    return required, extras


def third_party_imports(path: Path) -> set[str]:
    """The top-level modules ``path`` imports anywhere (a function's deferred import included)
    that are neither the standard library nor memalpha's own (memalpha, memalpha_lab)."""
    found = {name.split(".")[0] for name in absolute_imports(path.read_text(encoding="utf-8"))}
    ours = {"memalpha", "memalpha_lab"}
    return {top for top in found if top not in sys.stdlib_module_names and top not in ours}


def undeclared(package: Path, required: set[str], extras: set[str] = frozenset()) -> dict[str, list[str]]:
    """``{distribution: [files importing it]}`` for each import of ``package`` that ``required``
    does not cover. Only the optional integrations (``integrations/``, used by a user of an extra:
    docs/trl.md) may import what ``extras`` adds."""
    optional = package / "integrations"
    distributions = packages_distributions()
    missing: dict[str, list[str]] = {}
    for path in sorted(package.rglob("*.py")):
        allowed = required | extras if optional in path.parents else required
        for module in third_party_imports(path):
            names = {canonical(d) for d in distributions.get(module, [module])}
            if not names & allowed:
                missing.setdefault(min(names), []).append(str(path.relative_to(package.parent)))
    return missing


def test_every_package_memalpha_imports_is_declared():
    assert undeclared(PACKAGE, *declared(REPO / "pyproject.toml")) == {}


def test_every_package_the_lab_imports_is_declared():
    lab_required, _ = declared(LAB / "pyproject.toml")
    memalpha_required, _ = declared(REPO / "pyproject.toml")
    assert undeclared(LAB / "memalpha_lab", lab_required | memalpha_required) == {}


def test_the_rule_sees_an_undeclared_and_an_extra_only_import(tmp_path):
    package = tmp_path / "memalpha"
    (package / "integrations").mkdir(parents=True)
    (package / "core.py").write_text(
        "import os\nimport torch\n\n\ndef f():\n    import yaml\n    from trl import x\n"
    )
    (package / "integrations" / "bridge.py").write_text("from trl.trainer import y\nfrom . import core\n")
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(
        '[project]\ndependencies = ["torch>=2.4"]\n'
        '[project.optional-dependencies]\ntrl = ["trl>=1.16"]\ndev = ["PyYAML"]\n'
    )
    found = undeclared(package, *declared(pyproject))
    # yaml: only the local kit declares it; trl: an extra, so only the integration may import it
    assert found == {"pyyaml": ["memalpha/core.py"], "trl": ["memalpha/core.py"]}
