"""Which of a folder's openstarry wheels pip installs here, checked: this CPython's own.

    python tests/pick_wheel.py dist                         # prints the wheel's path
    python tests/pick_wheel.py dist --python-version 3.15   # a CPython with no wheel of its own

Asks pip itself (``pip download --no-index --find-links FOLDER``), so the
answer is the wheel a user's ``pip install openstarry`` gets from that set.
Exits 1, saying which wheel pip took, unless it is the version-specific wheel
of the running CPython (``cp312-cp312``, ``cp314-cp314t`` on a free-threaded
3.14), or, with ``--python-version``, the abi3 wheel (the fallback for the
CPythons after the last one with a wheel of its own). The release workflow
runs it on every platform and CPython it builds for. Standard library only.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path


def own_tag() -> str:
    """The running CPython's own wheel tags: ``cp312-cp312``, ``cp314-cp314t``."""
    version = f"{sys.version_info[0]}{sys.version_info[1]}"
    threads = "t" if sysconfig.get_config_var("Py_GIL_DISABLED") else ""
    return f"cp{version}-cp{version}{threads}"


def picked(folder: Path, python_version: str | None = None) -> Path:
    """The wheel of ``folder`` that pip installs (on ``python_version``, if given)."""
    with tempfile.TemporaryDirectory() as dest:
        command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-index"]
        command += ["--only-binary=:all:", "--find-links", str(folder), "--dest", dest]
        if python_version is not None:
            command += ["--python-version", python_version]
        done = subprocess.run([*command, "openstarry"], capture_output=True, text=True)
        if done.returncode != 0:
            raise LookupError(done.stderr.strip().splitlines()[-1] if done.stderr else "pip failed")
        (name,) = (path.name for path in Path(dest).iterdir())
    return folder / name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("folder", type=Path, help="the wheels (dist/)")
    parser.add_argument(
        "--python-version",
        metavar="X.Y",
        help="ask for this CPython instead, one without a wheel of its own: the abi3 wheel",
    )
    args = parser.parse_args(argv)
    try:
        wheel = picked(args.folder, args.python_version)
    except LookupError as exc:
        print(f"pick_wheel: pip installs no wheel of {args.folder}: {exc}", file=sys.stderr)
        return 1
    expected = "abi3" if args.python_version else own_tag()
    # NAME-VERSION[-BUILD]-PYTHON-ABI-PLATFORM.whl; no tag holds a "-".
    python, abi = wheel.name.removesuffix(".whl").split("-")[-3:-1]
    tags = abi if args.python_version else f"{python}-{abi}"
    if tags != expected:
        where = f"CPython {args.python_version}" if args.python_version else own_tag()
        print(
            f"pick_wheel: pip installs {wheel.name} on {where}, not its {expected} wheel",
            file=sys.stderr,
        )
        return 1
    print(wheel)
    return 0


if __name__ == "__main__":
    sys.exit(main())
