"""What the docs' tests share: the build's own modules (``docs/hooks.py``, ``docs/griffe_rest.py``),
loaded from their files, since ``docs/`` is not a package."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

DOCS = Path(__file__).resolve().parent.parent / "docs"


def load_docs_module(name: str) -> ModuleType:
    """``docs/NAME.py``, loaded as a module of its own."""
    spec = importlib.util.spec_from_file_location(f"openstarry_docs_{name}", DOCS / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
