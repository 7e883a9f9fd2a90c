"""tests/pick_wheel.py: which wheel pip installs from the release's set, on each CPython.

The defect it guards: the release published only abi3 wheels (plus cp314t), so
pip installed the slower stable-ABI build on every CPython. Here pip itself
chooses among wheels that carry this machine's platform tag.
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

PICK = Path(__file__).with_name("pick_wheel.py")
PLATFORM = sysconfig.get_platform().replace("-", "_").replace(".", "_")
FREE_THREADED = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))
VERSION = f"cp{sys.version_info[0]}{sys.version_info[1]}"
#: This CPython's own wheel tags: cp312-cp312, or cp314-cp314t when free-threaded.
OWN = f"{VERSION}-{VERSION}{'t' if FREE_THREADED else ''}"


def _wheel(folder: Path, tags: str) -> Path:
    """An empty openstarry wheel with these tags, enough for pip to choose it."""
    path = folder / f"openstarry-0.1.0-{tags}-{PLATFORM}.whl"
    info = "openstarry-0.1.0.dist-info"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr(
            f"{info}/METADATA", "Metadata-Version: 2.1\nName: openstarry\nVersion: 0.1.0\n"
        )
        wheel.writestr(
            f"{info}/WHEEL", f"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: {tags}-{PLATFORM}\n"
        )
        wheel.writestr(f"{info}/RECORD", "")
    return path


def _pick(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(PICK), str(folder), *args], capture_output=True, text=True, timeout=120
    )


@pytest.fixture
def release(tmp_path: Path) -> Path:
    """The release's set: abi3, each CPython's own wheel from 3.10 to 3.14, and cp314t."""
    _wheel(tmp_path, "cp310-abi3")
    for minor in range(10, 15):
        _wheel(tmp_path, f"cp3{minor}-cp3{minor}")
    _wheel(tmp_path, "cp314-cp314t")
    return tmp_path


def test_pip_picks_this_cpythons_own_wheel(release: Path) -> None:
    done = _pick(release)
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).name == f"openstarry-0.1.0-{OWN}-{PLATFORM}.whl"


@pytest.mark.skipif(FREE_THREADED, reason="abi3 does not cover free-threaded CPython")
def test_a_newer_cpython_gets_the_abi3_wheel(release: Path) -> None:
    done = _pick(release, "--python-version", "3.15")
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).name == f"openstarry-0.1.0-cp310-abi3-{PLATFORM}.whl"


@pytest.mark.skipif(FREE_THREADED, reason="abi3 does not cover free-threaded CPython")
def test_abi3_alone_is_refused(tmp_path: Path) -> None:
    """The set the release published before: pip's pick is the abi3 wheel, and that fails."""
    _wheel(tmp_path, "cp310-abi3")
    done = _pick(tmp_path)
    assert done.returncode == 1
    assert done.stderr.strip() == (
        f"pick_wheel: pip installs openstarry-0.1.0-cp310-abi3-{PLATFORM}.whl on {OWN}, "
        f"not its {OWN} wheel"
    )


def test_no_fallback_is_refused(tmp_path: Path) -> None:
    _wheel(tmp_path, OWN)
    done = _pick(tmp_path, "--python-version", "3.15")
    assert done.returncode == 1
    assert done.stderr.startswith(f"pick_wheel: pip installs no wheel of {tmp_path}: ")
