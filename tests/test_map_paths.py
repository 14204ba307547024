"""Every path and module the map names exists: README.md, docs/, packaging/README.md and every docstring.

docs/architecture.md is the map of the code; a path it names that is gone sends a newcomer to the wrong
file, so this fails on the first commit that moves a module without updating what names it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOP = ("backend", "studio", "tests", "bench", "scripts", "resources", "packaging", "docs")
SLASHED = re.compile(r"(?<![\w./~-])((?:%s)/[\w./-]*[\w/])(?![\w<{*])" % "|".join(TOP))
"""A repository path; one that goes on with a placeholder (`tests/backend/test_<name>.py`) is not checked."""
DOTTED = re.compile(r"(?<![\w./-])((?:backend|studio)(?:\.\w+)+)(?![\w<{*])")
DOCUMENTS = [ROOT / "README.md", ROOT / "packaging" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PACKAGES = sorted({d.name for d in (ROOT / "backend").rglob("*") if d.is_dir() and (d / "__init__.py").is_file()}
              | {d.name for d in (ROOT / "studio").rglob("*") if d.is_dir() and (d / "__init__.py").is_file()})
SHORT = re.compile(r"(?<![\w./~-])((?:%s)/[\w/]+\.py)\b" % "|".join(PACKAGES))
"""A path inside a package named from the package down (`config/run_config.py`, `shortcuts/installer.py`)."""
NOT_A_PATH = {
    # what a PyInstaller build writes, not a file of the repository
    "packaging/pyinstaller/dist/finetune-studio/",
}


def _docstrings(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)))]
    found = [ast.get_docstring(n, clean=False) for n in nodes]
    # attribute docstrings: a string statement right after an assignment
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list):
            found += [s.value.value for s in body if isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)
                      and isinstance(s.value.value, str)]
    return [d for d in found if d]


def _texts() -> list[tuple[str, str]]:
    texts = [(str(doc.relative_to(ROOT)), doc.read_text(encoding="utf-8")) for doc in DOCUMENTS]
    for top in ("backend", "studio", "bench", "scripts", "packaging", "tests"):
        for path in sorted((ROOT / top).rglob("*.py")):
            texts += [(str(path.relative_to(ROOT)), d) for d in _docstrings(path)]
    return texts


def _top_names(module: Path) -> set[str]:
    tree = ast.parse(module.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.If):  # TYPE_CHECKING blocks and the like
            for sub in node.body:
                if isinstance(sub, (ast.Import, ast.ImportFrom)):
                    names |= {(a.asname or a.name).split(".")[0] for a in sub.names}
    return names


def _dotted_problem(name: str) -> str | None:
    """None when `name` is a module, a package, or a module's top-level name (then anything after it)."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:cut])
        module = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
        if not module.is_file():
            continue
        rest = parts[cut:]
        if not rest or rest[0] in _top_names(module) or (base.is_dir() and (base / rest[0]).exists()):
            return None
        return f"{'.'.join(parts[:cut])} has no {rest[0]}"
    return "no such module"


def _short_problem(path: str) -> str | None:
    """None when some package of backend/ or studio/ holds `path` (its first folder is that package's name)."""
    if any(next((ROOT / top).glob(f"**/{path}"), None) for top in ("backend", "studio")):
        return None
    return "no package holds it"


def _slashed_problem(path: str) -> str | None:
    if path in NOT_A_PATH or (ROOT / path).exists():
        return None
    return "no such file or folder"


def test_every_named_path_exists():
    problems = []
    for where, text in _texts():
        for path in set(SLASHED.findall(text)):
            path = path.rstrip(".")
            if (problem := _slashed_problem(path)):
                problems.append(f"{where}: {path}: {problem}")
        for path in set(SHORT.findall(text)):
            if not path.startswith(TOP) and (problem := _short_problem(path)):
                problems.append(f"{where}: {path}: {problem}")
        for name in set(DOTTED.findall(text)):
            if (problem := _dotted_problem(name.rstrip("."))):
                problems.append(f"{where}: {name}: {problem}")
    assert not problems, f"{len(problems)} stale names:\n" + "\n".join(sorted(problems))


def test_the_check_catches_a_stale_name():
    assert _slashed_problem("backend/cli_serve_run.py")
    assert _slashed_problem("backend/core/protocol.py") is None
    assert _short_problem("api/reporter.py") and _short_problem("config/run_config.py") is None
    assert _dotted_problem("backend.api.runs.RunFolder") == "backend.api has no runs"
    assert _dotted_problem("backend.core.runs.run_folder.RunFolder.path") is None
    assert _dotted_problem("backend.core.protocol") is None


def test_every_backend_module_is_on_the_map():
    """docs/architecture.md names every module of backend/ (its module tables), so a new one is placed on the map."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    missing = [str(path.relative_to(ROOT)) for path in sorted((ROOT / "backend").rglob("*.py"))
               if path.name != "__init__.py" and path.name not in text]
    assert not missing, "modules docs/architecture.md does not name: " + ", ".join(missing)
