"""The picture of ``openstarry bench latency --plot``: latency percentiles against rate.

It needs matplotlib, in the ``[bench]`` extra (``pip install 'openstarry[bench]'``).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path

from openstarry.bench.latency import KNEE_US, PERCENTILES, BenchError, RateResult

__all__ = ["check_matplotlib", "plot_latency"]

_STYLES = ("-", "--", ":", "-.")
_MARKERS = ("o", "s", "^", "D")


def check_matplotlib() -> None:
    """Raise :class:`BenchError` when matplotlib is not installed."""
    if importlib.util.find_spec("matplotlib") is None:
        raise BenchError(
            "--plot needs matplotlib, which is not installed: pip install 'openstarry[bench]'"
        )


def plot_latency(results: Sequence[RateResult], path: Path) -> None:
    """Write a PNG to ``path``: each bus's percentiles against rate (log-log), and its
    achieved rate against the rate asked for.

    Raises:
        BenchError: matplotlib is not installed.
    """
    check_matplotlib()
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    buses = list(dict.fromkeys(r.bus for r in results))
    figure, (latency_axes, rate_axes) = plt.subplots(
        1, 2, figsize=(13, 5.5), gridspec_kw={"width_ratios": [3, 2]}
    )
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for index, bus in enumerate(buses):
        rows = sorted((r for r in results if r.bus == bus), key=lambda r: r.rate_per_s)
        rates = [r.rate_per_s for r in rows]
        style = _STYLES[index % len(_STYLES)]
        marker = _MARKERS[index % len(_MARKERS)]
        for series, (title, key) in enumerate(PERCENTILES):
            latency_axes.plot(
                rates,
                [max(getattr(r, key), 0.01) for r in rows],
                linestyle=style,
                marker=marker,
                color=colors[series % len(colors)],
                label=f"{bus} {title}" if len(buses) > 1 else title,
            )
        rate_axes.plot(
            rates,
            [r.achieved_per_s for r in rows],
            linestyle=style,
            marker=marker,
            color="black",
            label=bus,
        )
    latency_axes.axhline(KNEE_US, color="grey", linewidth=0.8, linestyle=(0, (4, 4)))
    latency_axes.annotate("1 ms", (0.01, KNEE_US), xycoords=("axes fraction", "data"))
    latency_axes.set(
        xscale="log",
        yscale="log",
        xlabel="arrival rate (events/s)",
        ylabel="latency from intended send time (µs)",
        title="Dispatch latency, open loop",
    )
    latency_axes.grid(True, which="both", alpha=0.3)
    latency_axes.legend(fontsize="small", ncol=2 if len(buses) > 1 else 1)
    if results:
        low = min(r.rate_per_s for r in results)
        high = max(r.rate_per_s for r in results)
        rate_axes.plot([low, high], [low, high], color="grey", linewidth=0.8, label="asked for")
    rate_axes.set(
        xscale="log",
        yscale="log",
        xlabel="arrival rate asked for (events/s)",
        ylabel="events handled per second",
        title="Achieved rate",
    )
    rate_axes.grid(True, which="both", alpha=0.3)
    rate_axes.legend(fontsize="small")
    handler = results[0].handler if results else "no-op"
    duration = results[0].duration_s if results else 0
    figure.suptitle(f"openstarry bench latency: handler {handler}, {duration:g} s per rate")
    figure.tight_layout()
    figure.savefig(path, format="png", dpi=100)
    plt.close(figure)
