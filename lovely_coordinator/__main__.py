"""Command line: ``python -m lovely_coordinator demo`` and ``python -m lovely_coordinator bench``."""

from __future__ import annotations

import sys

_USAGE = """\
usage: python -m lovely_coordinator COMMAND [ARGS...]

commands:
  demo     run a short simulated agent fleet (no network) and print what happened
  bench    run the benchmarks (python -m lovely_coordinator bench --help)
"""


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in {"-h", "--help"}:
        print(_USAGE, end="")
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command == "demo":
        from ._demo import main as demo_main

        return demo_main(rest)
    if command == "bench":
        from ._bench import main as bench_main

        return bench_main(rest)
    print(f"unknown command {command!r}\n\n{_USAGE}", end="", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
