"""The wheelhouse that benchmarks/gpu_check.sh brings to a machine without network: which
requirements it holds (the project's and its dev extra's, never torch: the GPU machine has its own
CUDA build), and which of its wheels that machine lacks.

    python -m benchmarks.wheelhouse requirements            # for `pip download` (make wheelhouse)
    python -m benchmarks.wheelhouse missing WHEELHOUSE [--all]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NOT_BROUGHT = ("torch",)  # the machine's own build; its version is tolerated


def normalize(name: str) -> str:
    """A distribution name as PEP 503 compares them (``Foo_Bar`` == ``foo-bar``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(req: str) -> str:
    return normalize(re.split(r"[\s<>=!~;\[]", req.strip(), maxsplit=1)[0])


def requirements(pyproject: Path = REPO / "pyproject.toml", extras: tuple[str, ...] = ("dev",)) -> list[str]:
    """The project's dependencies and those of ``extras``, less torch."""
    project = tomllib.loads(pyproject.read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in extras:
        if extra not in project.get("optional-dependencies", {}):
            raise SystemExit(f"{pyproject}: no optional-dependencies extra {extra!r}")
        reqs += project["optional-dependencies"][extra]
    return [r for r in reqs if requirement_name(r) not in NOT_BROUGHT]


def wheel_name_version(path: Path) -> tuple[str, str]:
    """(normalized distribution, version) from a wheel's file name (PEP 427)."""
    parts = path.name[: -len(".whl")].split("-")
    if not path.name.endswith(".whl") or len(parts) < 5:
        raise ValueError(f"{path.name}: not a wheel file name (NAME-VERSION-...-PY-ABI-PLATFORM.whl)")
    return normalize(parts[0]), parts[1]


def installed_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def missing(wheelhouse: Path, all_wheels: bool = False) -> tuple[list[Path], list[str]]:
    """The wheels to install (those whose distribution is absent; every one with ``all_wheels``)
    and a note per distribution kept at another version than the wheelhouse's."""
    if not wheelhouse.is_dir():
        raise SystemExit(f"wheelhouse {wheelhouse} not found: build it with `make wheelhouse` on a "
                         "machine with network and bring it along (--wheelhouse DIR)")
    todo, notes = [], []
    for whl in sorted(wheelhouse.glob("*.whl")):
        name, version = wheel_name_version(whl)
        if name in NOT_BROUGHT:
            continue
        have = installed_version(name)
        if have is None or all_wheels:
            todo.append(whl)
        elif have != version:
            notes.append(f"{name}: keeping the installed {have} (wheelhouse has {version})")
    return todo, notes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("requirements", help="print the requirements the wheelhouse holds")
    m = sub.add_parser("missing", help="print the wheels this interpreter lacks, one a line")
    m.add_argument("wheelhouse", type=Path)
    m.add_argument("--all", action="store_true", help="every wheel (to override the system's)")
    a = ap.parse_args(argv)
    if a.cmd == "requirements":
        print("\n".join(requirements()))
        return 0
    todo, notes = missing(a.wheelhouse, a.all)
    for n in notes:
        print(n, file=sys.stderr)
    print("\n".join(str(p) for p in todo))
    return 0


if __name__ == "__main__":
    sys.exit(main())
