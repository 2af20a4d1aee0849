"""The command line: ``python -m lovely_coordinator demo|bench|top``."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable

_USAGE = """\
usage: python -m lovely_coordinator COMMAND [ARGS...]

commands:
  demo     run a short simulated agent fleet (no network) and print what happened;
           --replicas 3: across 3 processes sharing a throwaway Valkey
  bench    run the benchmarks (python -m lovely_coordinator bench --help)
  top      watch a coordinator's serve_statistics() endpoint live (top URL)
"""


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in {"-h", "--help"}:
        print(_USAGE, end="")
        return 0 if args else 2
    command, rest = args[0], args[1:]
    modules = {"demo": "._demo", "bench": "._bench", "top": "._top"}
    if command in modules:
        entry: Callable[[list[str]], int] = importlib.import_module(
            modules[command], __package__
        ).main
        return entry(rest)
    print(f"unknown command {command!r}\n\n{_USAGE}", end="", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
