"""Print the ratios of one benchmark run as a markdown table.

Usage: ``python benches/ratios.py [RUN.json] [--strict]``

Reads the JSON that pytest-benchmark wrote for the run (by default where
``benches/conftest.py`` has it written) and, for every group, sets each
baseline's median beside openstarry's: ratio = baseline median / openstarry
median, so 4.0x means openstarry took a quarter of the time. Rows with a target
say whether it was met: a target is a least ratio, except a row's ``ceiling``
(the same work on another backend), a most. Times are per operation (one
push+pop, one id, one envelope, one line, one turn); the turn group's are CPU
time. A group's entries come from tests of their own (``harness.measure``) or
from one test whose sides took turns, one round each
(``harness.measure_alternating``); the table reads both alike.

Each side's time is the median of its rounds; the ``spread`` column is how far
the rounds of the row's two sides strayed from their medians (half the
interquartile range of each, relative to its median, added up: the share by
which the ratio itself may be off within this run). With ``--strict`` the exit
status is 1 when a target is missed by more than :data:`TOLERANCE`, the
run-to-run spread ``benches/README.md`` states for this shared machine; a miss
within it is marked ``within spread``, and every missed row is named at the end.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Where ``conftest.py`` has pytest-benchmark write its JSON unless given
#: ``--benchmark-json``; the repository's ``.benchmarks/`` is git-ignored.
DEFAULT_JSON = Path(__file__).resolve().parent.parent / ".benchmarks" / "openstarry-latest.json"

#: How far a ratio may fall short of its target before ``--strict`` fails the run: the
#: spread of ratios between whole runs on a shared 2-core machine (benches/README.md).
TOLERANCE = 0.15


@dataclass(frozen=True)
class Entry:
    group: str
    label: str
    role: str
    per_op: float  # median seconds per operation
    target: float | None
    note: str
    #: A baseline whose ratio must stay at most this (the same work on another backend).
    ceiling: float | None = None
    #: Half the interquartile range of the rounds, relative to their median.
    spread: float = 0.0


def _entries(run: dict[str, Any]) -> list[Entry]:
    out: list[Entry] = []
    for bench in run.get("benchmarks", []):
        info = bench.get("extra_info", {})
        if "role" not in info:
            continue
        out.append(
            Entry(
                group=bench.get("group") or bench["name"],
                label=info.get("label", bench["name"]),
                role=info["role"],
                per_op=bench["stats"]["median"] / max(1, int(info.get("ops", 1))),
                target=info.get("target"),
                note=info.get("note", ""),
                ceiling=info.get("ceiling"),
                spread=_spread(bench["stats"]),
            )
        )
    return out


def _spread(stats: dict[str, Any]) -> float:
    median = stats.get("median") or 0.0
    iqr = stats.get("iqr") or 0.0
    return iqr / 2 / median if median > 0 else 0.0


#: Groups are listed in this order (by prefix); others follow in run order.
_GROUP_ORDER = (
    "queue: push+pop",
    "queue: push_many",
    "dedup: check_and_insert,",
    "dedup: check_and_insert_many",
    "envelope decode",
    "ingest",
    "turn",
    "bus: publish a burst",
)


def _order(group: str) -> int:
    return next((i for i, p in enumerate(_GROUP_ORDER) if group.startswith(p)), len(_GROUP_ORDER))


def _time(seconds: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def _mark(notes: list[str], note: str) -> str:
    """`` [n]`` for ``note`` (numbered once however often it is used), or nothing."""
    if not note:
        return ""
    if note not in notes:
        notes.append(note)
    return f" [{notes.index(note) + 1}]"


@dataclass
class Tally:
    """The targets of a table: how many, how many met, and the rows that missed beyond
    :data:`TOLERANCE`."""

    targets: int = 0
    met: int = 0
    missed: list[str] | None = None

    def count(self, row: str, ok: bool, short_by: float) -> str:
        """Count one target; the ``met`` cell."""
        self.targets += 1
        if ok:
            self.met += 1
            return "yes"
        if short_by <= TOLERANCE:
            return "**no** (within spread)"
        if self.missed is None:
            self.missed = []
        self.missed.append(row)
        return "**no**"


def table(entries: list[Entry]) -> tuple[list[str], Tally]:
    """The markdown lines, and how many targets there are, met and missed."""
    lines = [
        "| group | openstarry | median | baseline | median | ratio | spread | target | met |",
        "|---|---|---:|---|---:|---:|---:|---:|:---:|",
    ]
    notes: list[str] = []
    tally = Tally()
    groups: dict[str, list[Entry]] = {}
    for e in sorted(entries, key=lambda e: _order(e.group)):
        groups.setdefault(e.group, []).append(e)
    for group, members in groups.items():
        reports = [e for e in members if e.role == "report"]
        for e in reports:
            lines.append(f"| {group} | {e.label}{_mark(notes, e.note)} | | | | | | | |")
        if reports and len(reports) == len(members):
            continue
        ours = [e for e in members if e.role == "openstarry"]
        if len(ours) != 1:
            lines.append(
                f"| {group} | ({len(ours)} openstarry entries, expected 1) | | | | | | | |"
            )
            continue
        reference = ours[0]
        floors = [e for e in members if e.role == "floor"]
        shown_group, shown_label = group, reference.label + _mark(notes, reference.note)
        for base in (e for e in members if e.role == "baseline"):
            ratio = base.per_op / reference.per_op
            row = f"{group}: {reference.label} vs {base.label}"
            if base.ceiling is not None:
                goal = f"≤ {base.ceiling:g}x"
                ok = tally.count(row, ratio <= base.ceiling, ratio / base.ceiling - 1)
            elif base.target is None:
                goal, ok = "", ""
            else:
                goal = f"≥ {base.target:g}x"
                ok = tally.count(row, ratio >= base.target, 1 - ratio / base.target)
            label = base.label + _mark(notes, base.note)
            spread = reference.spread + base.spread
            lines.append(
                f"| {shown_group} | {shown_label} | {_time(reference.per_op)} | {label} "
                f"| {_time(base.per_op)} | {ratio:.2f}x | ±{spread:.0%} | {goal} | {ok} |"
            )
            shown_group = shown_label = ""
        for floor in floors:
            own = reference.per_op - floor.per_op
            net = ", ".join(
                f"{b.label} {(b.per_op - floor.per_op) / own:.2f}x"
                for b in members
                if b.role == "baseline" and b.target is not None and own > 0
            )
            note = f"{floor.note} Every median in this group includes it." + (
                f" Net of it, openstarry takes {_time(own)}; ratios: {net}." if net else ""
            )
            lines.append(
                f"| | | | {floor.label}{_mark(notes, note)} | {_time(floor.per_op)} | | | | |"
            )
    lines.append("")
    lines += [f"[{i}] {note}" for i, note in enumerate(notes, 1)]
    return lines, tally


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "run", nargs="?", type=Path, default=DEFAULT_JSON, help="pytest-benchmark JSON"
    )
    parser.add_argument(
        "--strict",
        action="store_true",
        help=f"exit 1 when a target is missed by more than {TOLERANCE:.0%}",
    )
    args = parser.parse_args(argv)
    path: Path = args.run
    try:
        run = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        print(f"cannot read benchmark results from {path}: {e}", file=sys.stderr)
        print("run `make bench` (or pytest benches --benchmark-enable) first", file=sys.stderr)
        return 2
    entries = _entries(run)
    if not entries:
        print(f"{path} holds no openstarry benchmark", file=sys.stderr)
        return 2
    machine = run.get("machine_info", {})
    cpu = machine.get("cpu", {}).get("brand_raw", "unknown CPU")
    print(
        f"\nopenstarry vs pure-Python baselines, run of {run.get('datetime', '?')} "
        f"(Python {machine.get('python_version', '?')}, {cpu})"
    )
    extension = machine.get("openstarry_extension")
    if extension:
        print(f"openstarry extension: {extension['build']} build ({extension['file']})")
    print("ratio = baseline median / openstarry median; times are medians per operation.\n")
    lines, tally = table(entries)
    print("\n".join(lines))
    print(f"\n{tally.met} of {tally.targets} targets met.")
    missed = tally.missed or []
    if missed:
        print(f"Missed by more than the {TOLERANCE:.0%} a run may stray:")
        print("\n".join(f"- {row}" for row in missed))
    return 1 if args.strict and missed else 0


if __name__ == "__main__":
    sys.exit(main())
