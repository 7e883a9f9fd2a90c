"""Make every benchmark run leave its JSON where ``ratios.py`` reads it."""

from __future__ import annotations

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
