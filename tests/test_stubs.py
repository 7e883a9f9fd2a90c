"""The stub ``_core.pyi`` is the API contract: stubtest keeps it and the extension in step."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_stubtest_finds_no_difference_between_stub_and_extension() -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "openstarry._core"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    output = completed.stdout + completed.stderr
    print(output)
    assert completed.returncode == 0, output
