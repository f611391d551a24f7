"""docs/architecture.md stays true to the tree: it opens with its two pictures, its file lists name
every module of the package and nothing else, the layer picture draws only allowed imports and
every layer, and README links the page first."""

from __future__ import annotations

import re
from pathlib import Path

from test_architecture import ALLOWED

REPO_ROOT = Path(__file__).resolve().parents[1]
PAGE = REPO_ROOT / "docs" / "architecture.md"

_ROW = re.compile(r"^\|\s*\[`[^`]*`\]\(\.\./(memalpha[^)]*)\)\s*\|([^|]*)\|", re.MULTILINE)
_FILE_NAME = re.compile(r"`([\w/]+\.py)`")
_PATH = re.compile(r"\bmemalpha/[\w/]+\.py\b")
_MERMAID = re.compile(r"^```mermaid\n(.*?)^```", re.DOTALL | re.MULTILINE)
_NODE = re.compile(r"^\s*(\w+)\[", re.MULTILINE)
_EDGE = re.compile(r"^\s*(\w+)\s*-->\s*(\w+)\s*$", re.MULTILINE)
_LINK = re.compile(r"\]\(\s*([^)\s#]+)")


def listed_files(markdown: str) -> set[str]:
    """The package files the page's tables list: a row whose link names a file lists that file; a
    row whose link names a folder lists every backticked ``name.py`` of its second cell, in that folder."""
    files = set()
    for target, description in _ROW.findall(markdown):
        folder = target.rstrip("/")
        if folder.endswith(".py"):
            files.add(folder)
        else:
            files.update(f"{folder}/{name}" for name in _FILE_NAME.findall(description))
    return files


def named_paths(markdown: str) -> set[str]:
    """Every ``memalpha/....py`` path written anywhere on the page (links, pictures, text)."""
    return set(_PATH.findall(markdown))


def package_modules(root: Path = REPO_ROOT) -> set[str]:
    """Every module file of the package, ``__init__.py`` files (docstrings only) left out."""
    return {
        path.relative_to(root).as_posix()
        for path in (root / "memalpha").rglob("*.py")
        if path.name != "__init__.py"
    }


def layer_picture(markdown: str) -> tuple[set[str], list[tuple[str, str]]]:
    """The nodes and the arrows of the page's first mermaid picture."""
    block = _MERMAID.findall(markdown)[0]
    return set(_NODE.findall(block)), _EDGE.findall(block)


def test_the_page_opens_with_the_two_pictures():
    page = PAGE.read_text(encoding="utf-8")
    first_section = page.split("\n## ", 2)[1]
    assert first_section.startswith("The picture"), "the first section of the page is its pictures"
    assert len(_MERMAID.findall(first_section)) == 2, "a picture of the layers and one of a GRPO step"


def test_the_page_lists_every_module_and_no_other_file():
    page = PAGE.read_text(encoding="utf-8")
    modules = package_modules()
    gone = sorted(path for path in listed_files(page) | named_paths(page) if not (REPO_ROOT / path).is_file())
    assert not gone, f"docs/architecture.md names files that do not exist: {gone}"
    unlisted = sorted(modules - listed_files(page))
    assert not unlisted, f"docs/architecture.md's tables do not list these modules: {unlisted}"


def test_the_step_picture_names_only_real_files():
    step_picture = _MERMAID.findall(PAGE.read_text(encoding="utf-8"))[1]
    named = named_paths(step_picture)
    assert "memalpha/agent/rollout.py" in named and "memalpha/grpo/loss.py" in named
    assert named <= package_modules()


def test_the_layer_picture_draws_every_layer_and_only_allowed_imports():
    nodes, edges = layer_picture(PAGE.read_text(encoding="utf-8"))
    assert set(ALLOWED) <= nodes, f"layers missing from the picture: {sorted(set(ALLOWED) - nodes)}"
    assert edges, "the layer picture draws no arrow"
    wrong = [(a, b) for a, b in edges if b not in ALLOWED.get(a, set())]
    assert not wrong, f"arrows the layer rules forbid (tests/test_architecture.py, ALLOWED): {wrong}"


def test_the_checks_see_a_stale_file_a_missing_module_and_a_forbidden_arrow(tmp_path):
    (tmp_path / "memalpha" / "agent").mkdir(parents=True)
    for name in ("__init__.py", "agent/__init__.py", "agent/rollout.py", "agent/new.py", "seeding.py"):
        (tmp_path / "memalpha" / name).write_text('"""x"""\n', encoding="utf-8")
    page = (
        "| [`memalpha/seeding.py`](../memalpha/seeding.py) | seeds | nothing |\n"
        "| [`memalpha/agent/`](../memalpha/agent) | `rollout.py` (rollouts), `gone.py` (moved) | `lm` |\n"
        "```mermaid\nflowchart TB\n  lm[\"lm/\"]\n  agent[\"agent/\"]\n  lm --> agent\n```\n"
    )
    listed, modules = listed_files(page), package_modules(tmp_path)
    assert listed == {"memalpha/seeding.py", "memalpha/agent/rollout.py", "memalpha/agent/gone.py"}
    assert listed - modules == {"memalpha/agent/gone.py"}
    assert modules - listed == {"memalpha/agent/new.py"}
    _nodes, edges = layer_picture(page)
    assert [(a, b) for a, b in edges if b not in ALLOWED.get(a, set())] == [("lm", "agent")]


def test_readme_links_the_architecture_page_first():
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    docs = [target for target in _LINK.findall(readme) if target.startswith("docs/")]
    assert docs and docs[0] == "docs/architecture.md", f"README's first page link is {docs[:1]}"
    assert readme.index("docs/architecture.md") < readme.index("\n## "), "linked before the first section"
