"""docs/architecture.md's "The walk of one step" stays true to the code.

The walk starts at :meth:`memalpha.train.step.GRPOStep.train_next` (the step ``training_step``
calls) and follows the step's own objects, read from the source: a function is entered when a
call hands it the step (``self``), a part of it (``self.agent.reader``), or a value made from them
(an assignment, a loop over them, a call's result), and its file is on the walk. A call on an
object whose class is not known (a callable held in a variable: the agent's sampler) is not
followed; a call on a parameter annotated with a package class reaches that method in the class
and in every subclass that overrides it (``reader: Reader`` reaches ``ExtractiveReader.answer``).

The page lists the walk's files in two parts: the files the step walks through (at most 20, each
with what the step does there) and the helpers they hand the step's data to in turn. The two
together must be exactly the walk: a new file the step's data reaches, or a listed file it no
longer reaches, fails here until the page says so.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "memalpha"
ENTRY = ("memalpha.train.step", "GRPOStep.train_next", "self")
BUILTIN_METHODS = frozenset(
    name for kind in (str, list, dict, set, tuple, bytes) for name in dir(kind) if not name.startswith("_")
)
"""Methods of the built-in containers and strings (``text.format``, ``rows.append``): never a
package method of the same name."""

_WALK = re.compile(r"<!-- step-walk -->\n(.*?)<!-- /step-walk -->", re.DOTALL)
_BELOW = re.compile(r"<!-- step-walk-below -->\n(.*?)<!-- /step-walk-below -->", re.DOTALL)
_FILE = re.compile(r"\[`(memalpha/[\w/]+\.py)`\]")


class Source:
    """Every module of the package as a syntax tree, with its functions, classes and imports."""

    def __init__(self) -> None:
        self.trees: dict[str, ast.Module] = {}
        self.paths: dict[str, str] = {}
        for path in sorted(PACKAGE.rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            module = ".".join(parts)
            self.trees[module] = ast.parse(path.read_text(encoding="utf-8"))
            self.paths[module] = path.relative_to(REPO).as_posix()
        self.functions: dict[tuple[str, str], ast.FunctionDef] = {}
        self.classes: dict[tuple[str, str], ast.ClassDef] = {}
        self.methods: dict[str, list[tuple[str, str]]] = {}
        self.subclasses: dict[str, list[tuple[str, str]]] = {}
        for module, tree in self.trees.items():
            for node in tree.body:
                if isinstance(node, ast.FunctionDef):
                    self.functions[module, node.name] = node
                elif isinstance(node, ast.ClassDef):
                    self.classes[module, node.name] = node
                    for base in node.bases:
                        if isinstance(base, ast.Name):
                            self.subclasses.setdefault(base.id, []).append((module, node.name))
                    for item in node.body:
                        if isinstance(item, ast.FunctionDef):
                            key = (module, f"{node.name}.{item.name}")
                            self.functions[key] = item
                            self.methods.setdefault(item.name, []).append(key)
        self.imports = {
            module: {
                alias.asname or alias.name: (node.module, alias.name)
                for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("memalpha")
                for alias in node.names
            }
            for module, tree in self.trees.items()
        }

    def named(self, module: str, name: str) -> tuple[str, str] | None:
        """The function or class ``name`` means in ``module``: its own, or one it imports."""
        for key in [(module, name), self.imports[module].get(name)]:
            if key in self.functions or key in self.classes:
                return key
        return None

    def callees(self, module: str, cls: str | None, call: ast.Call, notes: dict[str, str]) -> list:
        """The package functions ``call`` (in ``module``, inside class ``cls``) may enter."""
        func = call.func
        if isinstance(func, ast.Name):
            target = self.named(module, func.id)
            if target in self.classes:
                target = (target[0], f"{target[1]}.__init__")
            return [target] if target in self.functions else []
        if not isinstance(func, ast.Attribute):
            return []
        owner, name = func.value, func.attr
        if isinstance(owner, ast.Name):
            if owner.id in ("self", "cls") and (module, f"{cls}.{name}") in self.functions:
                return [(module, f"{cls}.{name}")]
            kind = self.named(module, notes.get(owner.id, owner.id))
            if kind in self.classes:
                found = [(kind[0], f"{kind[1]}.{name}")]
                found += [(m, f"{c}.{name}") for m, c in self.subclasses.get(kind[1], [])]
                return [key for key in found if key in self.functions]
        if name in BUILTIN_METHODS:
            return []
        candidates = self.methods.get(name, [])
        return candidates if len(candidates) == 1 else []  # several: chosen at run time, not followed


def carries(node: ast.AST | None, names: set[str]) -> bool:
    """Whether the value of ``node`` is one of ``names``, a part of one, or a call made with one."""
    if isinstance(node, ast.Name):
        return node.id in names
    if isinstance(node, (ast.Attribute, ast.Subscript, ast.Starred)):
        return carries(node.value, names)
    if isinstance(node, ast.Call):
        return carries(node.func, names) or any(carries(a, names) for a in node.args) or any(
            carries(k.value, names) for k in node.keywords
        )
    if isinstance(node, ast.IfExp):
        return carries(node.body, names) or carries(node.orelse, names)
    if isinstance(node, ast.BoolOp):
        return any(carries(value, names) for value in node.values)
    return False


def names_in(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def parameters(function: ast.FunctionDef) -> list[str]:
    """Positional parameter names, the ``*args`` name repeated for the values it collects."""
    args = function.args
    names = [a.arg for a in [*args.posonlyargs, *args.args]]
    return names + ([args.vararg.arg] * 32 if args.vararg is not None else [])


def annotations(function: ast.FunctionDef) -> dict[str, str]:
    """Each parameter annotated with a bare class name (``reader: Reader | None``), and that name."""
    notes = {}
    args = function.args
    for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
        note = arg.annotation.left if isinstance(arg.annotation, ast.BinOp) else arg.annotation
        if isinstance(note, ast.Name):
            notes[arg.arg] = note.id
        elif isinstance(note, ast.Constant) and isinstance(note.value, str):
            notes[arg.arg] = note.value.split("|")[0].strip()
    return notes


def carrying_names(function: ast.FunctionDef, start: set[str]) -> set[str]:
    """``start`` and every local name assigned (or looped, or opened) from a value they carry."""
    names = set(start)
    while True:
        before = len(names)
        for node in ast.walk(function):
            if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.NamedExpr)):
                goals = node.targets if isinstance(node, ast.Assign) else [node.target]
                if carries(node.value, names):
                    names.update(*(names_in(goal) for goal in goals))
            elif isinstance(node, (ast.For, ast.comprehension)) and carries(node.iter, names):
                names |= names_in(node.target)
            elif isinstance(node, ast.withitem) and carries(node.context_expr, names):
                names |= names_in(node.optional_vars) if node.optional_vars is not None else set()
        if len(names) == before:
            return names


def step_walk(source: Source) -> set[str]:
    """The files of the walk of one step (this module's docstring)."""
    files: set[str] = set()
    seen: set[tuple] = set()
    pending = [(ENTRY[0], ENTRY[1], frozenset({ENTRY[2]}))]
    while pending:
        visit = pending.pop()
        if visit in seen:
            continue
        seen.add(visit)
        module, qualname, given = visit
        files.add(source.paths[module])
        function = source.functions[module, qualname]
        cls = qualname.split(".")[0] if "." in qualname else None
        names, notes = carrying_names(function, set(given)), annotations(function)
        for call in (node for node in ast.walk(function) if isinstance(node, ast.Call)):
            for target in source.callees(module, cls, call, notes):
                params = parameters(source.functions[target])
                method = "." in target[1] and params[:1] in (["self"], ["cls"])
                bound = set()
                if method and isinstance(call.func, ast.Attribute) and carries(call.func.value, names):
                    bound.add(params[0])
                skip = 1 if method else 0
                bound |= {
                    params[skip + i]
                    for i, arg in enumerate(call.args)
                    if skip + i < len(params) and carries(arg, names)
                }
                bound |= {k.arg for k in call.keywords if k.arg is not None and carries(k.value, names)}
                if bound:
                    pending.append((target[0], target[1], frozenset(bound)))
    return files


def listed(pattern: re.Pattern) -> list[str]:
    section = pattern.search((REPO / "docs" / "architecture.md").read_text(encoding="utf-8"))
    assert section is not None, f"docs/architecture.md lost its {pattern.pattern[:24]} section"
    return _FILE.findall(section.group(1))


def test_the_page_lists_the_walk_of_one_step():
    walked, below = listed(_WALK), listed(_BELOW)
    assert len(walked) == len(set(walked)) and not set(walked) & set(below), (walked, below)
    assert len(walked) <= 20, f"the step walks through {len(walked)} files: {walked}"
    found = step_walk(Source())
    page = set(walked) | set(below)
    assert found == page, (
        f"the step's data reaches files the page does not list: {sorted(found - page)}; the page lists"
        f" files it does not reach: {sorted(page - found)}"
    )


def test_the_walk_follows_the_steps_data_and_no_other():
    """The rules on a small module of this test's own: a call handing over the step or a value made
    from it is followed, one that hands over only other values is not, and neither is a call of a
    callable held in a variable."""
    tree = ast.parse(
        "def entry(self, other):\n"
        "    part = self.agent\n"
        "    used(part)\n"
        "    unused(other, 3)\n"
        "    sample = part.sampler\n"
        "    sample(part)\n"
        "def used(agent):\n"
        "    deeper(agent.reader)\n"
        "def deeper(reader):\n"
        "    pass\n"
        "def unused(x, y):\n"
        "    pass\n"
    )
    source = Source.__new__(Source)
    source.trees, source.paths = {"m": tree}, {"m": "m.py"}
    source.functions = {("m", node.name): node for node in tree.body}
    source.classes, source.methods, source.subclasses, source.imports = {}, {}, {}, {"m": {}}
    names = carrying_names(source.functions["m", "entry"], {"self"})
    assert names == {"self", "part", "sample"}
    calls = [node for node in ast.walk(source.functions["m", "entry"]) if isinstance(node, ast.Call)]
    entered = {
        target[1] for call in calls for target in source.callees("m", None, call, {})
        if any(carries(arg, names) for arg in call.args)
    }
    assert entered == {"used"}  # unused gets only `other` and 3; `sample` is no package function
