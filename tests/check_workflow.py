"""Check that the release workflow builds, tests and publishes the wheels pip should pick.

    python tests/check_workflow.py [.github/workflows/release.yml]

``make lint`` runs it. On every platform of :data:`PLATFORMS` the workflow must:

- **build** (a row of the ``build`` matrix named after the platform) the
  version-specific wheels of every CPython of :data:`VERSIONS` (the row's
  ``versions``, given to a maturin step without the ``abi3`` feature, off by
  default) and the abi3 wheel (an unconditional maturin step with ``--features
  python,abi3``: features named there replace pyproject.toml's), the fallback for newer
  CPythons; macOS and Windows build with the runner's own interpreters, so the
  job's ``setup-python`` step must install each of them;
- **check what pip picks** on each CPython of :data:`VERSIONS` with
  ``tests/pick_wheel.py``: the ``pick`` job (glibc Linux, macOS, Windows) and
  ``test-musllinux`` (musl);
- **test** both kinds of wheel: a ``wheel: pip`` and a ``wheel: abi3`` row of
  the ``test`` matrix (musl: ``test-musllinux`` smoke-tests both).

Prints each problem on a line of its own and exits 1 if there is any. Needs
ruamel.yaml (check-jsonschema's YAML parser, in requirements-dev.txt).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

WORKFLOW = Path(__file__).resolve().parent.parent / ".github" / "workflows" / "release.yml"

#: Every platform the release ships wheels for (the build matrix's row names).
PLATFORMS = (
    "manylinux-x86_64",
    "manylinux-aarch64",
    "musllinux-x86_64",
    "musllinux-aarch64",
    "macos-x86_64",
    "macos-arm64",
    "windows-x64",
)
MUSL = tuple(name for name in PLATFORMS if name.startswith("musllinux"))
#: The CPythons with a version-specific wheel of their own; newer ones get the abi3 wheel.
VERSIONS = ("3.10", "3.11", "3.12", "3.13", "3.14")


def load(path: Path = WORKFLOW) -> dict[str, Any]:
    workflow: dict[str, Any] = YAML(typ="safe").load(path.read_text(encoding="utf-8"))
    return workflow


def _words(value: Any) -> set[str]:
    return set(str(value or "").split())


def _abi3(args: str) -> bool:
    """Whether maturin's arguments turn the ``abi3`` feature on (with ``python``: the
    features named on the command line replace pyproject.toml's)."""
    features = re.findall(r"--features[ =](\S+)", args)
    named = {f for group in features for f in group.split(",")}
    return "abi3" in named and "python" in named


def _missing(wanted: Iterable[str], have: Iterable[Any]) -> list[str]:
    have = {str(item) for item in have}
    return [item for item in wanted if item not in have]


def _steps(job: dict[str, Any], action: str) -> list[dict[str, Any]]:
    return [step for step in job.get("steps") or [] if action in str(step.get("uses", ""))]


def _runs(job: dict[str, Any], script: str) -> bool:
    return any(script in str(step.get("run", "")) for step in job.get("steps") or [])


def problems(workflow: dict[str, Any]) -> list[str]:
    """What the workflow lacks, one sentence each (none: it is complete)."""
    found: list[str] = []
    jobs: dict[str, Any] = workflow.get("jobs") or {}

    build = jobs.get("build") or {}
    rows = {
        row.get("name"): row
        for row in build.get("strategy", {}).get("matrix", {}).get("include") or []
    }
    for platform in _missing(PLATFORMS, rows):
        found.append(f"build: no row for {platform}")
    for platform in PLATFORMS:
        for version in _missing(VERSIONS, _words(rows.get(platform, {}).get("versions"))):
            if platform in rows:
                found.append(
                    f"build: {platform} builds no version-specific wheel for CPython {version}"
                )
    makers = [step for step in _steps(build, "maturin-action") if "if" not in step]
    arguments = [str((step.get("with") or {}).get("args", "")) for step in makers]
    if not any(
        not _abi3(args) and "--interpreter ${{ matrix.versions }}" in args for args in arguments
    ):
        found.append(
            "build: no maturin step with --interpreter ${{ matrix.versions }} and without"
            " the abi3 feature (the version-specific wheels)"
        )
    if not any(_abi3(args) for args in arguments):
        found.append("build: no maturin step with --features python,abi3 (the abi3 wheel)")
    installed = [step for step in _steps(build, "setup-python") if "if" not in step]
    for version in VERSIONS:
        if not any(
            version in _words((s.get("with") or {}).get("python-version")) for s in installed
        ):
            found.append(f"build: setup-python does not install CPython {version} (macOS, Windows)")

    pick = jobs.get("pick") or {}
    matrix = pick.get("strategy", {}).get("matrix", {})
    names = [platform.get("name") for platform in matrix.get("platform") or []]
    for platform in _missing([p for p in PLATFORMS if p not in MUSL], names):
        found.append(f"pick: no job checks what pip picks on {platform}")
    for version in _missing(VERSIONS, matrix.get("python") or []):
        found.append(f"pick: no job checks what pip picks on CPython {version}")
    if not _runs(pick, "tests/pick_wheel.py"):
        found.append("pick: tests/pick_wheel.py is not run")

    musl = jobs.get("test-musllinux") or {}
    matrix = musl.get("strategy", {}).get("matrix", {})
    extra = matrix.get("include") or []
    musl_names = [*(matrix.get("name") or []), *(row.get("name") for row in extra)]
    musl_pythons = [*(matrix.get("python") or []), *(row.get("python") for row in extra)]
    for platform in _missing(MUSL, musl_names):
        found.append(f"test-musllinux: no job for {platform}")
    for version in _missing(VERSIONS, musl_pythons):
        found.append(f"test-musllinux: no job checks what pip picks on CPython {version}")
    if not _runs(musl, "tests/pick_wheel.py"):
        found.append("test-musllinux: tests/pick_wheel.py is not run")

    tests = (jobs.get("test") or {}).get("strategy", {}).get("matrix", {}).get("include") or []
    for platform in PLATFORMS:
        if platform in MUSL:
            continue
        for wheel in ("pip", "abi3"):
            if not any(row.get("name") == platform and row.get("wheel") == wheel for row in tests):
                found.append(f"test: no row tests {platform}'s {wheel} wheel")
    return found


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    path = Path(args[0]) if args else WORKFLOW
    found = problems(load(path))
    for problem in found:
        print(f"{path}: {problem}")
    if not found:
        print(
            f"{path}: {len(PLATFORMS)} platforms x CPython {', '.join(VERSIONS)} + abi3: complete"
        )
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
