"""Check built wheels the way ``pip`` on a user's machine will meet them.

Run by ``make test`` (on the wheel it tests) and ``make wheels`` (on every wheel
it builds): ``python tests/check_wheel.py dist/*.whl``. For each wheel:

- the extension module is an ELF file for the architecture the tag names;
- a manylinux wheel: ``auditwheel show`` agrees with the tag, the highest glibc
  symbol version the extension needs is no higher than the tag allows (2.17 for
  manylinux2014), and every library it links is on the policy's allowed list;
- a musllinux wheel: the extension links musl's libc and nothing else;
- an abi3 wheel does not link libpython (the interpreter provides its symbols);
- the extension is stripped (no ``.symtab``), as the release profile asks.

Prints one line per wheel (tag, size, highest glibc, libraries) and exits
non-zero on the first wheel that fails.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile

# The architecture each platform tag names, as ELF's e_machine.
MACHINES = {"x86_64": "EM_X86_64", "aarch64": "EM_AARCH64"}
# What an extension may link on musllinux: musl's libc (the dynamic loader is the same file).
MUSL_ALLOWED = re.compile(r"^(libc\.so|libc\.musl-(x86_64|aarch64)\.so\.1)$")
GLIBC = re.compile(r"^GLIBC_(\d+)\.(\d+)(?:\.\d+)?$")


class WheelError(Exception):
    """A wheel that would not work where its tag says it does."""


def platform_tag(wheel: Path) -> str:
    """The last platform tag of ``name-ver-py-abi-plat1.plat2.whl``: the PEP 600 one."""
    return wheel.name.removesuffix(".whl").split("-")[-1].split(".")[-1]


def extension(wheel: Path) -> tuple[str, bytes]:
    with zipfile.ZipFile(wheel) as zf:
        names = [n for n in zf.namelist() if re.search(r"\.(so|pyd)$|\.so\.", n)]
        if len(names) != 1:
            raise WheelError(f"expected one extension module, found {names}")
        return names[0], zf.read(names[0])


def elf_facts(data: bytes) -> tuple[str, list[str], bool]:
    """The ELF file's machine, its DT_NEEDED libraries, and whether it keeps a symbol table."""
    elf = ELFFile(io.BytesIO(data))
    needed: list[str] = []
    for section in elf.iter_sections():
        if isinstance(section, DynamicSection):
            # pyelftools sets each tag's value as an attribute named after the tag.
            needed += [vars(tag)["needed"] for tag in section.iter_tags("DT_NEEDED")]
    return str(elf["e_machine"]), needed, elf.get_section_by_name(".symtab") is not None


def auditwheel(wheel: Path) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "auditwheel", "show", "--json", str(wheel)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    report: dict[str, Any] = json.loads(out)
    return report


#: Files that are not Python modules, which the package reads at run time.
DATA = (
    "openstarry/bus/redis/scripts/flush.lua",
    "openstarry/bus/redis/scripts/renew.lua",
    "openstarry/bus/redis/scripts/free.lua",
    "openstarry/api/console/index.html",
    "openstarry/api/console/console.js",
    "openstarry/api/console/console.css",
    "openstarry/py.typed",
)
#: The bus backends a wheel registers (entry points), by URL scheme.
BACKENDS = ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster")


def package_data(wheel: Path) -> None:
    """The wheel carries the package's data files and registers the bus backends."""
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        missing = [name for name in DATA if name not in names]
        if missing:
            raise WheelError(f"files missing from the wheel: {missing}")
        entry = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        text = zf.read(entry[0]).decode() if entry else ""
    section = text.partition("[openstarry.bus_backends]")[2].partition("[")[0]
    schemes = {line.split("=")[0].strip() for line in section.splitlines() if "=" in line}
    if not set(BACKENDS) <= schemes:
        raise WheelError(f"bus backends not registered: {sorted(set(BACKENDS) - schemes)}")


def check(wheel: Path) -> str:
    package_data(wheel)
    tag = platform_tag(wheel)
    match = re.fullmatch(r"(manylinux|musllinux)_(\d+)_(\d+)_(x86_64|aarch64)", tag)
    if not match:
        raise WheelError(f"not a manylinux or musllinux tag: {tag}")
    family, major, minor, arch = match[1], int(match[2]), int(match[3]), match[4]
    name, data = extension(wheel)
    machine, needed, symtab = elf_facts(data)
    if machine != MACHINES[arch]:
        raise WheelError(f"{name} is built for {machine}, the tag says {arch}")
    if "-abi3-" in wheel.name and any(lib.startswith("libpython") for lib in needed):
        raise WheelError(f"an abi3 extension must not link libpython: {needed}")
    if symtab:
        raise WheelError(f"{name} is not stripped (it has a .symtab)")

    glibc = "-"
    if family == "manylinux":
        report = auditwheel(wheel)
        if report["external_libs"]:
            raise WheelError(f"links libraries outside the policy: {report['external_libs']}")
        if report["overall_tag"] != tag:
            raise WheelError(f"auditwheel says {report['overall_tag']}, the wheel says {tag}")
        versions = [
            (int(m[1]), int(m[2]))
            for symbols in report["versioned_symbols"].values()
            for m in map(GLIBC.match, symbols)
            if m
        ]
        highest = max(versions, default=(0, 0))
        if highest > (major, minor):
            raise WheelError(f"needs glibc {highest[0]}.{highest[1]}, the tag allows {tag}")
        glibc = f"{highest[0]}.{highest[1]}"
    else:
        outside = [lib for lib in needed if not MUSL_ALLOWED.match(lib)]
        if outside:
            raise WheelError(f"links libraries other than musl's libc: {outside}")
    size = wheel.stat().st_size
    return f"ok  {wheel.name}  {size / 1024:.0f} KiB  glibc {glibc}  needs {', '.join(needed)}"


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: check_wheel.py WHEEL...", file=sys.stderr)
        return 2
    for arg in argv:
        try:
            print(check(Path(arg)))
        except WheelError as err:
            print(f"FAIL {Path(arg).name}: {err}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
