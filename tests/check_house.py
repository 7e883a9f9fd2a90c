"""The house rules `make lint` checks beside the import contracts (pyproject.toml).

- no Python module of the package over 800 lines (the generated ``_core.pyi`` aside);
- no class with more than 20 methods;
- no import cycle between modules, ``TYPE_CHECKING`` imports and imports inside
  functions included (import-linter's ``acyclic_siblings`` sees packages; this
  sees every module, a package's ``__init__`` and its own submodules too).

    python tests/check_house.py [python/openstarry]
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

MAX_LINES = 800
MAX_METHODS = 20


def oversized(root: Path) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_LINES:
            found.append(f"{path}: {lines} lines (at most {MAX_LINES})")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                methods = sum(
                    isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) for item in node.body
                )
                if methods > MAX_METHODS:
                    found.append(f"{path}: class {node.name} has {methods} methods")
    return found


def cycles(package: str) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    import grimp

    graph = grimp.build_graph(package, cache_dir=None)
    modules = sorted(graph.modules)
    edges = {
        m: sorted(set(graph.find_modules_directly_imported_by(m)) & graph.modules) for m in modules
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in modules:
        if root in index:
            continue
        work = [(root, iter(edges[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(edges[child])))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def main(argv: list[str]) -> int:
    root = Path(argv[1] if len(argv) > 1 else "python/openstarry")
    problems = oversized(root)
    problems += [f"import cycle: {' -> '.join(c)}" for c in cycles(root.name)]
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
