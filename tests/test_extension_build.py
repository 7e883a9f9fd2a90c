"""Which build of the Rust extension is loaded, and that ``make bench`` says which it measured.

The defect: ``make bench`` printed the build the Makefile asked for
(``ABI=...``), not the one the run loaded, and nothing in a run's results said
which build gave the figures (abi3 and version-specific differ by 1.5x on the
batch queue calls).
"""

from __future__ import annotations

import importlib.machinery
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from benches import ratios

import openstarry
from openstarry import _core
from openstarry.bench import describe_extension, extension_build

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    ("name", "build"),
    [
        ("_core.abi3.so", "abi3"),
        ("_core.pyd", "abi3"),
        ("/site-packages/openstarry/_core.abi3.so", "abi3"),
        ("_core.cpython-311-x86_64-linux-gnu.so", "version-specific"),
        ("_core.cpython-314t-aarch64-linux-musl.so", "version-specific"),
        ("_core.cpython-313-darwin.so", "version-specific"),
        ("_core.cp312-win_amd64.pyd", "version-specific"),
    ],
)
def test_the_build_is_told_from_the_file_name(name: str, build: str) -> None:
    assert extension_build(name) == build


def test_this_interpreters_own_suffixes() -> None:
    """The names this CPython loads: its own tag first, then the stable ABI's."""
    suffixes = importlib.machinery.EXTENSION_SUFFIXES
    assert extension_build("_core" + suffixes[0]) == "version-specific"
    stable = ".pyd" if sys.platform == "win32" else ".abi3.so"
    assert stable in suffixes
    assert extension_build("_core" + stable) == "abi3"


def test_the_loaded_extension_is_described() -> None:
    name = os.path.basename(_core.__file__)
    assert describe_extension() == f"openstarry extension: {extension_build()} build ({name})"


BENCH = """
def test_tiny(benchmark):
    benchmark.extra_info.update(label="tiny", role="openstarry", ops=1, target=None, note="")
    benchmark.group = "tiny group"
    benchmark(sum, range(10))
"""


def test_a_benchmark_run_records_and_prints_the_build(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "test_tiny_bench.py").write_text(BENCH)
    out = tmp_path / "run.json"
    # The benches package, and the openstarry this process imported.
    package = Path(openstarry.__file__).resolve().parent.parent
    path = os.pathsep.join([str(ROOT), str(package)])
    options = ["-p", "benches.conftest", "-p", "no:randomly", "-p", "no:cacheprovider"]
    options += ["--benchmark-enable", f"--benchmark-json={out}", "--benchmark-min-rounds=1"]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "test_tiny_bench.py", "-q", *options],
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    run = json.loads(out.read_text())
    name = os.path.basename(_core.__file__)
    assert run["machine_info"]["openstarry_extension"] == {"build": extension_build(), "file": name}
    assert ratios.main([str(out)]) == 0
    assert f"openstarry extension: {extension_build()} build ({name})\n" in capsys.readouterr().out
