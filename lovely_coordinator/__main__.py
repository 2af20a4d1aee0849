"""The command line: ``python -m lovely_coordinator top|demo|bench``."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable

_USAGE = """\
usage: python -m lovely_coordinator COMMAND [ARGS...]

commands:
  top      watch a coordinator's serve_statistics() endpoint live (top URL)
  demo     run a short simulated agent fleet (no network) and print what happened;
           --replicas 3: across 3 processes sharing a throwaway Valkey
  bench    run the benchmarks (python -m lovely_coordinator bench --help)

demo and bench come with the development distribution, lovely-coordinator-dev
(from a checkout: pip install ./dev).
"""

# Where each command lives. ``top`` ships with the library; the demo and the benchmarks
# are development tools, kept out of the runtime package, found here only when installed.
_COMMANDS = {
    "top": "lovely_coordinator._cli.top",
    "demo": "lovely_coordinator_dev.demo.simulated",
    "bench": "lovely_coordinator_dev.bench",
}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in {"-h", "--help"}:
        print(_USAGE, end="")
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command not in _COMMANDS:
        print(f"unknown command {command!r}\n\n{_USAGE}", end="", file=sys.stderr)
        return 2
    try:
        module = importlib.import_module(_COMMANDS[command])
    except ModuleNotFoundError as exc:
        if exc.name != "lovely_coordinator_dev":
            raise
        print(
            f"{command!r} needs the development distribution, lovely-coordinator-dev: "
            "from a checkout of the repository, pip install ./dev",
            file=sys.stderr,
        )
        return 2
    entry: Callable[[list[str]], int] = module.main
    return entry(rest)


if __name__ == "__main__":
    sys.exit(main())
