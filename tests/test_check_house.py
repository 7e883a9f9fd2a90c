"""tests/check_house.py finds what `make lint` must refuse: a long module, a big class, a cycle."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from check_house import cycles, oversized, oversized_rust, private_imports


def test_a_long_module_a_big_class_and_a_cycle_are_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "housepkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    methods = "".join(f"    def m{i}(self) -> None: ...\n" for i in range(21))
    (package / "big.py").write_text("class Big:\n" + methods + "\n" * 800)
    (package / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import housepkg.b\n"
    )
    (package / "b.py").write_text("def f() -> None:\n    import housepkg.a\n")
    (package / "c.py").write_text("import housepkg.a\n")
    (package / "d.py").write_text("from housepkg.a import _hidden, __version__, shown\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    found = oversized(package)
    assert any("big.py" in p and "lines" in p for p in found)
    assert any("class Big has 21 methods" in p for p in found)
    assert cycles("housepkg") == [["housepkg.a", "housepkg.b"]]
    (import_,) = private_imports(package)
    assert "d.py:1: imports _hidden from housepkg.a" in import_


def test_a_long_rust_file_is_found(tmp_path: Path) -> None:
    rust = tmp_path / "rust"
    (rust / "queue").mkdir(parents=True)
    (rust / "queue.rs").write_text("fn f() {}\n" * 800)
    (rust / "queue" / "tests.rs").write_text("#[test]\nfn t() {}\n" * 401)
    assert oversized_rust(rust) == ["rust/queue/tests.rs: 802 lines (at most 800)"]


def test_openstarry_keeps_the_rules() -> None:
    root = Path(__file__).parent.parent / "python" / "openstarry"
    assert oversized(root) == []
    assert oversized_rust() == []
    assert private_imports(root) == []
    assert cycles("openstarry") == []
