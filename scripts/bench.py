"""Run the benchmarks; the same as ``python -m lovely_coordinator bench``."""

import sys

from lovely_coordinator_dev.bench import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
