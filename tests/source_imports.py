"""The modules a source file imports, read from its syntax tree (the tests that police imports)."""

from __future__ import annotations

import ast


def absolute_imports(source: str) -> list[str]:
    """The dotted module names of every absolute import in ``source``, anywhere in it (a function's
    deferred import included): ``import a.b`` -> ``a.b``, ``from a.b import c`` -> ``a.b``."""
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names
