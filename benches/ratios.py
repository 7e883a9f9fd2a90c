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
(``harness.measure_alternating``); the table reads both alike. With
``--strict`` the exit status is 1 when a target is missed.
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
            )
        )
    return out


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


def table(entries: list[Entry]) -> tuple[list[str], int, int]:
    """The markdown lines, how many targets there are, and how many were met."""
    lines = [
        "| group | openstarry | median | baseline | median | ratio | target | met |",
        "|---|---|---:|---|---:|---:|---:|:---:|",
    ]
    notes: list[str] = []
    targets = met = 0
    groups: dict[str, list[Entry]] = {}
    for e in sorted(entries, key=lambda e: _order(e.group)):
        groups.setdefault(e.group, []).append(e)
    for group, members in groups.items():
        reports = [e for e in members if e.role == "report"]
        for e in reports:
            lines.append(f"| {group} | {e.label}{_mark(notes, e.note)} | | | | | | |")
        if reports and len(reports) == len(members):
            continue
        ours = [e for e in members if e.role == "openstarry"]
        if len(ours) != 1:
            lines.append(f"| {group} | ({len(ours)} openstarry entries, expected 1) | | | | | | |")
            continue
        reference = ours[0]
        floors = [e for e in members if e.role == "floor"]
        shown_group, shown_label = group, reference.label + _mark(notes, reference.note)
        for base in (e for e in members if e.role == "baseline"):
            ratio = base.per_op / reference.per_op
            if base.ceiling is not None:
                targets += 1
                met += ratio <= base.ceiling
                goal, ok = f"≤ {base.ceiling:g}x", "yes" if ratio <= base.ceiling else "**no**"
            elif base.target is None:
                goal, ok = "", ""
            else:
                targets += 1
                met += ratio >= base.target
                goal, ok = f"≥ {base.target:g}x", "yes" if ratio >= base.target else "**no**"
            label = base.label + _mark(notes, base.note)
            lines.append(
                f"| {shown_group} | {shown_label} | {_time(reference.per_op)} | {label} "
                f"| {_time(base.per_op)} | {ratio:.2f}x | {goal} | {ok} |"
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
                f"| | | | {floor.label}{_mark(notes, note)} | {_time(floor.per_op)} | | | |"
            )
    lines.append("")
    lines += [f"[{i}] {note}" for i, note in enumerate(notes, 1)]
    return lines, targets, met


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "run", nargs="?", type=Path, default=DEFAULT_JSON, help="pytest-benchmark JSON"
    )
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
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
    lines, targets, met = table(entries)
    print("\n".join(lines))
    print(f"\n{met} of {targets} targets met.")
    return 1 if args.strict and met < targets else 0


if __name__ == "__main__":
    sys.exit(main())
