"""The house rules `make lint` checks beside the import contracts (pyproject.toml).

- no Python module of the package over 800 lines (the generated ``_core.pyi`` aside);
- no Rust source file under ``rust/`` over 800 lines, its tests included (a
  module's unit tests go in a file of their own beside it, ``rust/queue/tests.rs``
  for ``rust/queue.rs``);
- no class with more than 20 methods;
- no underscore name imported from another module of the package: what two
  modules share is public within the package (:data:`PRIVATE_IMPORTS` lists the
  few exceptions, each with its reason);
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
# The Rust crate's sources, found from this script's place in the repository.
REPO = Path(__file__).resolve().parent.parent
RUST = REPO / "rust"


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


#: Underscore names a module may import from another, each with its reason.
PRIVATE_IMPORTS = {
    # The compiled extension is the package's private module by its name; what it
    # exports is public through openstarry.core.
    ("openstarry", "_core"): "the extension module, imported by name",
    # Installed once by the bus on the extension's Published type: an entry point of
    # the extension's own for openstarry.bus, not for users.
    ("openstarry._core", "_install_published_hooks"): "the extension's hook for the bus",
}


def private_imports(root: Path) -> list[str]:
    """``from openstarry.x import _name`` in a module of the package (not its own names)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom) or node.module is None:
                continue
            if not node.module.startswith(root.name):
                continue
            for alias in node.names:
                name = alias.name
                private = name.startswith("_") and not name.startswith("__")
                if private and (node.module, name) not in PRIVATE_IMPORTS:
                    found.append(
                        f"{path}:{node.lineno}: imports {name} from {node.module} "
                        "(make it public within the package)"
                    )
    return found


def oversized_rust(root: Path = RUST) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.rs")):
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_LINES:
            found.append(f"{path.relative_to(root.parent)}: {lines} lines (at most {MAX_LINES})")
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
    problems += oversized_rust()
    problems += private_imports(root)
    problems += [f"import cycle: {' -> '.join(c)}" for c in cycles(root.name)]
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
