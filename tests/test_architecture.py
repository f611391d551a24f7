"""The package's layering, checked from the source: each layer imports only the layers below it,
no module imports in a circle, and every reference points to a file in the repository.

``docs/architecture.md`` describes the layers; :data:`ALLOWED` is that page's table as code.
Imports inside functions count as much as imports at the top of a module.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "memalpha"

# layer -> the memalpha layers it may import (besides itself).
# `seeding` and `templates` are shared leaves.
ALLOWED: dict[str, set[str]] = {
    "allocator": set(),  # the CUDA allocator's setting, applied where a process starts
    "atomic_file": set(),  # every file of a run written atomically
    "seeding": set(),
    "intervals": set(),  # Student t intervals, the math of memalpha compare
    "templates": set(),
    "memory": {"templates"},
    "tools": {"memory", "templates"},
    "lm": {"seeding"},
    "data": {"lm", "atomic_file"},
    "grpo": {"seeding"},
    "reader": {"memory", "lm", "templates"},
    "agent": {"memory", "tools", "lm", "data", "grpo", "reader", "seeding", "templates"},
    "train": {
        "memory", "tools", "lm", "data", "grpo", "reader", "agent", "seeding", "templates",
        "atomic_file", "intervals",
    },
    "commands": {
        "memory", "tools", "lm", "data", "grpo", "reader", "agent", "seeding", "templates",
        "train", "inference",
    },
    "cli": {"commands", "train", "templates", "allocator"},
    "inference": {
        "memory", "tools", "lm", "data", "reader", "agent", "train", "seeding", "templates", "atomic_file",
    },
    "integrations": {"memory", "tools", "data", "reader", "agent", "train", "seeding"},
}
# the experiments' measuring kit is a package of its own (experiments/lab/memalpha_lab), outside
# memalpha, which never imports it (test_the_product_never_imports_the_lab)

# inside lm: folder -> the lm folders it may import (besides itself); docs/architecture.md's lm table.
LM_ALLOWED: dict[str, set[str]] = {
    "core": set(),
    "logprobs": {"core"},
    "sampling": {"core"},
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "memalpha"


def _in_package(module: str) -> bool:
    return module == "memalpha" or module.startswith("memalpha.")


def memalpha_imports(path: Path) -> set[str]:
    """Every ``memalpha`` module ``path`` imports, wherever the import statement sits."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if _in_package(alias.name))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and _in_package(node.module or ""):
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                found.add(
                    candidate
                    if (PACKAGE.parent / (candidate.replace(".", "/") + ".py")).is_file()
                    else node.module
                )
    return found


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}
GRAPH = {name: memalpha_imports(path) - {name} for name, path in MODULES.items()}


def test_the_product_never_imports_the_lab():
    """memalpha_lab (experiments/lab/) measures memalpha and is not shipped with it: no module of the package
    imports it, so the package a user installs runs without it."""
    importing = sorted(
        name for name, path in MODULES.items()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if (isinstance(node, ast.Import) and any(a.name.split(".")[0] == "memalpha_lab" for a in node.names))
        or (isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "memalpha_lab")
    )
    assert not importing, f"product modules import memalpha_lab: {importing}"


def test_every_module_belongs_to_a_known_layer():
    unknown = sorted({layer_of(m) for m in MODULES} - set(ALLOWED) - {"memalpha"})
    assert not unknown, f"modules outside the layers of docs/architecture.md: {unknown}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_layers_import_only_lower_layers(module):
    layer = layer_of(module)
    if layer == "memalpha":  # the package's own __init__: its docstring and version, nothing else
        assert not GRAPH[module]
        return
    allowed = ALLOWED[layer] | {layer}
    wrong = sorted(target for target in GRAPH[module] if layer_of(target) not in allowed)
    assert not wrong, (
        f"{module} (layer {layer!r}) imports {wrong}; {layer!r} may import only {sorted(allowed)}"
    )


def lm_folder(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 3 and parts[1] == "lm" else None


def test_lm_has_only_its_three_folders():
    loose = sorted(m for m in MODULES if m.startswith("memalpha.lm.") and lm_folder(m) is None
                   and m.count(".") > 1 and not m.endswith(tuple(f".{f}" for f in LM_ALLOWED)))
    assert not loose, f"modules directly in memalpha/lm/ (put each in one of {sorted(LM_ALLOWED)}): {loose}"
    assert {lm_folder(m) for m in MODULES if lm_folder(m)} <= set(LM_ALLOWED)


@pytest.mark.parametrize("module", sorted(m for m in MODULES if lm_folder(m)))
def test_lm_folders_import_only_lower_folders(module):
    folder = lm_folder(module)
    allowed = LM_ALLOWED[folder] | {folder}
    wrong = sorted(t for t in GRAPH[module] if lm_folder(t) not in allowed and t.startswith("memalpha.lm."))
    assert not wrong, (
        f"{module} (lm/{folder}) imports {wrong}; lm/{folder} may import only lm/{sorted(allowed)}"
    )


def test_no_import_circles():
    state: dict[str, int] = {}  # 1 visiting, 2 done
    stack: list[str] = []

    def visit(name: str) -> None:
        state[name] = 1
        stack.append(name)
        for target in sorted(GRAPH.get(name, ())):
            if target not in MODULES:
                continue
            if state.get(target) == 1:
                cycle = stack[stack.index(target) :] + [target]
                raise AssertionError("import circle: " + " -> ".join(cycle))
            if target not in state:
                visit(target)
        stack.pop()
        state[name] = 2

    for name in sorted(MODULES):
        if name not in state:
            visit(name)


def _is_docstring_or_version(node: ast.stmt) -> bool:
    if isinstance(node, ast.Expr):
        return isinstance(node.value, ast.Constant)
    return isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["__version__"]


def test_package_inits_hold_no_reexports():
    """One import path per name: a package's ``__init__`` documents the package and imports nothing
    (the root one also holds the version), so importing memalpha runs nothing else."""
    for path in MODULES.values():
        if path.name == "__init__.py":
            tree = ast.parse(path.read_text(encoding="utf-8"))
            rest = [node for node in tree.body if not _is_docstring_or_version(node)]
            assert not rest, f"{path} holds more than its docstring: {[ast.unparse(n) for n in rest]}"


def test_sources_cite_only_files_in_the_repository():
    """No module points readers to a document outside the repository (the old 'SPEC §N' references),
    and every ``docs/*.md`` a module names exists."""
    offenders = [
        str(path.relative_to(PACKAGE.parent))
        for path in MODULES.values()
        if re.search(r"\bSPEC\b", path.read_text())
    ]
    assert not offenders, f"cite docs/*.md instead of a SPEC section: {offenders}"
    cited = {
        (str(path.relative_to(PACKAGE.parent)), doc)
        for path in MODULES.values()
        for doc in re.findall(r"docs/[\w./-]+\.md", path.read_text(encoding="utf-8"))
    }
    missing = sorted((source, doc) for source, doc in cited if not (PACKAGE.parent / doc).is_file())
    assert not missing, f"modules cite documents that do not exist: {missing}"


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for name in parts[cut:]:
                target = getattr(target, name)
        except AttributeError:
            return False
        return True
    return False


def test_docstring_cross_references_resolve():
    """Every ``:mod:``/``:func:``/``:class:``/``:meth:`` reference in the package names a real object."""
    pattern = re.compile(r":(?:mod|func|class|meth|data|attr):`~?(memalpha\.[\w.]+)`")
    broken = sorted(
        {
            (str(path.relative_to(PACKAGE.parent)), ref)
            for path in MODULES.values()
            for ref in pattern.findall(path.read_text(encoding="utf-8"))
            if not _resolves(ref)
        }
    )
    assert not broken, f"references to names that do not exist: {broken}"


MAX_INIT_ARGUMENTS = 12
"""The most arguments (besides ``self``) a constructor of the package takes; docs/architecture.md.

A group of settings that belong together travels as one settings object (``reader.retrieval``,
``reader.openai``, ``data.synthetic``) instead of one argument each."""


def _argument_count(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    args = function.args
    named = len(args.posonlyargs) + len(args.args) + len(args.kwonlyargs)
    return named - 1 + (args.vararg is not None) + (args.kwarg is not None)  # less self


def test_no_constructor_takes_more_than_twelve_arguments():
    """Every ``__init__`` written in the package takes at most :data:`MAX_INIT_ARGUMENTS` arguments
    (``*args`` and ``**kwargs`` count one each). Settings dataclasses, whose ``__init__`` is
    generated from their fields, are config groups rather than call signatures and are not counted."""
    over = sorted(
        (f"{path.relative_to(PACKAGE.parent)}:{node.name}.__init__", _argument_count(function))
        for path in MODULES.values()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.ClassDef)
        for function in node.body
        if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)) and function.name == "__init__"
        and _argument_count(function) > MAX_INIT_ARGUMENTS
    )
    assert not over, (
        f"constructors over {MAX_INIT_ARGUMENTS} arguments (group settings into an object): {over}"
    )


def test_the_argument_limit_check_counts_what_it_should():
    source = "class A:\n    def __init__(self, a, b=1, *rest, c, d=2, **more):\n        pass\n"
    function = ast.parse(source).body[0].body[0]
    assert _argument_count(function) == 6
