"""Make every benchmark run leave its JSON where ``ratios.py`` reads it."""

from __future__ import annotations

import os
from typing import Any

import pytest

from benches.ratios import DEFAULT_JSON


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    # pytest-benchmark reads this option in its own (trylast) pytest_configure.
    enabled = config.getoption("benchmark_enable", False) or not config.getoption(
        "benchmark_disable", False
    )
    if enabled and config.getoption("benchmark_json", None) is None:
        DEFAULT_JSON.parent.mkdir(parents=True, exist_ok=True)
        config.option.benchmark_json = DEFAULT_JSON


def pytest_benchmark_update_machine_info(
    config: pytest.Config, machine_info: dict[str, Any]
) -> None:
    """Record which build of the extension the run measured (``ratios.py`` prints it)."""
    from openstarry import _core
    from openstarry.bench import extension_build

    machine_info["openstarry_extension"] = {
        "build": extension_build(_core.__file__),
        "file": os.path.basename(_core.__file__),
    }
