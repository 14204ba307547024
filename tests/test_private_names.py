"""No module imports another module's private (`_name`) names: a helper another module needs is public.

A private name crossing modules hides a dependency from whoever changes it: it reads as free to
rename. Tests may reach into privates; the code may not.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def private_imports(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in ("backend", "studio"):
            found += [f"{node.module}.{a.name}" for a in node.names
                      if a.name.startswith("_") and not a.name.startswith("__")]
    return found


def test_no_private_name_crosses_modules():
    crossing = []
    for top in ("backend", "studio"):
        for path in sorted((ROOT / top).rglob("*.py")):
            crossing += [f"{path.relative_to(ROOT)}: {name}"
                         for name in private_imports(ast.parse(path.read_text(encoding="utf-8")))]
    assert not crossing, "private names imported across modules:\n" + "\n".join(crossing)


def test_the_check_sees_one():
    assert private_imports(ast.parse("from backend.export.verify import _helper")) == ["backend.export.verify._helper"]
    assert private_imports(ast.parse("from backend.export.verify import helper, __doc__")) == []
