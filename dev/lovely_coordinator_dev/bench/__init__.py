"""Benchmarks: ``python -m lovely_coordinator bench [SECTION ...] [--quick]``.

Each section is a module here exposing ``run(quick: bool) -> list[Figure]``. Figures that
compare against a target are ratios or bounds measured *in the same run*, so machine speed
cancels out. These are benchmarks, not tests: nothing here fails a build.
"""

from __future__ import annotations

import argparse
import importlib
import platform
import sys
from dataclasses import dataclass

__all__ = ["SECTIONS", "Figure", "main"]

SECTIONS = ("core", "budgets", "covers", "lanes", "turns", "redis", "provider", "fleet", "observe")


@dataclass(frozen=True, slots=True)
class Figure:
    """One printed line: a measured value, and for a target, the bound and whether it held."""

    name: str
    value: float
    unit: str
    target: float | None = None  # upper bound on value
    note: str = ""

    @property
    def met(self) -> bool | None:
        return None if self.target is None else self.value <= self.target


def _format(value: float) -> str:
    if value == 0 or 0.01 <= abs(value) < 1e6:
        return f"{value:,.3f}".rstrip("0").rstrip(".")
    return f"{value:.3g}"


def print_section(title: str, figures: list[Figure]) -> None:
    print(f"\n## {title}")
    width = max((len(f.name) for f in figures), default=10)
    for f in figures:
        line = f"  {f.name:<{width}}  {_format(f.value):>12} {f.unit:<8}"
        if f.target is not None:
            line += f"  target <= {_format(f.target)}  {'ok' if f.met else 'MISSED'}"
        if f.note:
            line += f"  ({f.note})"
        print(line, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lovely_coordinator bench")
    parser.add_argument("sections", nargs="*", help=f"any of {', '.join(SECTIONS)} (default: all)")
    parser.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    parser.add_argument("--otel", action="store_true", help="also the observe section")
    args = parser.parse_args(argv)
    unknown = [s for s in args.sections if s not in SECTIONS]
    if unknown:
        parser.error(f"unknown section(s) {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    print(f"python {platform.python_version()} on {platform.machine()} ({sys.platform})")
    missed = 0
    for name in dict.fromkeys([*(args.sections or SECTIONS), *(["observe"] * args.otel)]):
        try:
            module = importlib.import_module(f"{__name__}.{name}")
        except ImportError as exc:
            print(f"\n## {name}\n  skipped: {exc}")
            continue
        figures: list[Figure] = module.run(args.quick)
        print_section(name, figures)
        missed += sum(1 for f in figures if f.met is False)
    print(f"\n{missed} target(s) missed" if missed else "\nall targets met")
    return 0
