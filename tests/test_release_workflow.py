"""The release workflow builds, checks and tests the wheels pip should pick.

The defect: ``.github/workflows/release.yml`` published only abi3 wheels (and
cp314t), so pip installed the stable-ABI build, whose batch queue calls are
about 1.5x slower, on every CPython. ``make lint`` runs the same check
(``tests/check_workflow.py``).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

pytest.importorskip("ruamel.yaml", reason="check-jsonschema's YAML parser (requirements-dev.txt)")

from check_workflow import MUSL, PLATFORMS, VERSIONS, load, main, problems


@pytest.fixture(scope="module")
def workflow() -> dict[str, Any]:
    return load()


def _build_row(workflow: dict[str, Any], name: str) -> dict[str, Any]:
    rows: list[dict[str, Any]] = workflow["jobs"]["build"]["strategy"]["matrix"]["include"]
    return next(row for row in rows if row["name"] == name)


def test_the_release_workflow_is_complete(workflow: dict[str, Any]) -> None:
    assert problems(workflow) == []
    assert main([]) == 0


def test_every_platform_builds_every_version(workflow: dict[str, Any]) -> None:
    rows = workflow["jobs"]["build"]["strategy"]["matrix"]["include"]
    assert sorted(row["name"] for row in rows) == sorted(PLATFORMS)
    for row in rows:
        assert row["versions"].split() == list(VERSIONS)


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (
            "drop 3.12 from macos-arm64",
            "build: macos-arm64 builds no version-specific wheel for CPython 3.12",
        ),
        ("drop the windows-x64 row", "build: no row for windows-x64"),
        ("keep abi3 on", "build: no maturin step with --interpreter ${{ matrix.versions }} and"),
        ("abi3 without the bindings", "build: no maturin step with --features python,abi3"),
        ("drop the abi3 build", "build: no maturin step with --features python,abi3"),
        ("install only 3.10", "build: setup-python does not install CPython 3.13 (macOS, Windows)"),
        ("pick on 3.10 alone", "pick: no job checks what pip picks on CPython 3.11"),
        ("no pick on macos-x86_64", "pick: no job checks what pip picks on macos-x86_64"),
        ("musl on 3.12 alone", "test-musllinux: no job checks what pip picks on CPython 3.14"),
        ("test no abi3 wheel", "test: no row tests windows-x64's abi3 wheel"),
    ],
)
def test_a_missing_wheel_is_named(workflow: dict[str, Any], change: str, problem: str) -> None:
    changed = copy.deepcopy(workflow)
    jobs = changed["jobs"]
    build = jobs["build"]
    makers = [step for step in build["steps"] if "maturin-action" in step.get("uses", "")]
    if change == "drop 3.12 from macos-arm64":
        _build_row(changed, "macos-arm64")["versions"] = "3.10 3.11 3.13 3.14"
    elif change == "drop the windows-x64 row":
        build["strategy"]["matrix"]["include"].remove(_build_row(changed, "windows-x64"))
    elif change == "keep abi3 on":
        for step in makers:
            if "--features python,abi3" not in step["with"]["args"]:
                step["with"]["args"] += " --features python,abi3"
    elif change == "abi3 without the bindings":
        for step in makers:
            step["with"]["args"] = step["with"]["args"].replace("python,abi3", "abi3")
    elif change == "drop the abi3 build":
        build["steps"] = [
            step
            for step in build["steps"]
            if step not in makers or "abi3" not in step["with"]["args"] or "if" in step
        ]
    elif change == "install only 3.10":
        for step in build["steps"]:
            if "setup-python" in step.get("uses", "") and "if" not in step:
                step["with"]["python-version"] = "3.10"
    elif change == "pick on 3.10 alone":
        jobs["pick"]["strategy"]["matrix"]["python"] = ["3.10"]
    elif change == "no pick on macos-x86_64":
        platforms = jobs["pick"]["strategy"]["matrix"]["platform"]
        platforms[:] = [p for p in platforms if p["name"] != "macos-x86_64"]
    elif change == "musl on 3.12 alone":
        jobs["test-musllinux"]["strategy"]["matrix"]["python"] = ["3.12"]
    elif change == "test no abi3 wheel":
        rows = jobs["test"]["strategy"]["matrix"]["include"]
        rows[:] = [row for row in rows if row["wheel"] != "abi3"]
    found = problems(changed)
    assert any(line.startswith(problem) for line in found), found
    assert problems(workflow) == []  # the original is untouched


def test_musl_platforms_are_checked_in_alpine(workflow: dict[str, Any]) -> None:
    matrix = workflow["jobs"]["test-musllinux"]["strategy"]["matrix"]
    assert sorted(matrix["name"]) == sorted(MUSL)
    assert matrix["python"] == list(VERSIONS)
