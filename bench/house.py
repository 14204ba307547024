"""The house's shape from its imports: package cycles, module cycles, imports against the layers, modules per package.

Reads the code's imports with grimp (import-linter's graph; function-level imports included,
`if TYPE_CHECKING:` imports left out) and prints what docs/architecture.md's map promises, so a
before/after of a restructuring is one command on each commit:

    python bench/house.py                 # this checkout
    python bench/house.py --root /tmp/old # another checkout (a `git worktree add /tmp/old REV`)
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

LAYERS = ["cli", "api", "worker", "jobs", "pruning", "export", "evaluation", "serving", "training", "estimate",
          "runtime", "core"]
RANK = {"cli": 0, "api": 1, "worker": 1, "jobs": 2, "pruning": 3, "export": 4, "evaluation": 4, "serving": 4,
        "training": 5, "estimate": 6, "runtime": 6, "core": 7}
"""Today's layers (pyproject.toml's layers contract); a package of an older tree that is not here is shown apart."""


def package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def strongly_connected(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative: the module cycles."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    args = parser.parse_args()
    sys.path.insert(0, str(args.root.resolve()))
    import grimp

    graph = grimp.build_graph("backend", exclude_type_checking_imports=True)
    modules = sorted(m for m in graph.modules if m.startswith("backend."))
    edges = {m: {i for i in graph.find_modules_directly_imported_by(m) if i.startswith("backend.")} for m in modules}
    between: collections.Counter[tuple[str, str]] = collections.Counter()
    for importer, imported in ((a, b) for a in modules for b in edges[a]):
        if package(importer) != package(imported):
            between[package(importer), package(imported)] += 1
    cycles = sorted({tuple(sorted(pair)) for pair in between if (pair[1], pair[0]) in between})
    print(f"package cycles: {len(cycles)}" + "".join(
        f"\n  {a} <-> {b} ({between[a, b]} and {between[b, a]} imports)" for a, b in cycles))
    module_cycles = strongly_connected(edges)
    print(f"module cycles: {len(module_cycles)}" + "".join(f"\n  {' <-> '.join(c)}" for c in module_cycles))
    upward = {pair: n for pair, n in between.items()
              if pair[0] in RANK and pair[1] in RANK and RANK[pair[1]] <= RANK[pair[0]]}
    print(f"imports against today's layers (up or sideways): {sum(upward.values())}" + "".join(
        f"\n  {a} -> {b}: {n}" for (a, b), n in sorted(upward.items())))
    counts = collections.Counter(package(m) for m in modules if not graph.find_children(m))
    print("modules per package: " + ", ".join(f"{name} {counts[name]}" for name in sorted(counts)))
    apart = sorted(set(counts) - set(RANK))
    if apart:
        print("packages on no layer of today's contract: " + ", ".join(apart))


if __name__ == "__main__":
    main()
