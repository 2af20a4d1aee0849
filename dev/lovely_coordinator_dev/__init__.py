"""lovely-coordinator's development tools, kept out of the runtime package.

- ``demo``: ``python -m lovely_coordinator demo`` (a simulated agent fleet, no network);
- ``bench``: ``python -m lovely_coordinator bench ...`` (the benchmarks);
- ``testing``: throwaway Redis/Valkey servers, a fault-injecting proxy and child processes,
  which the tests and the benchmarks start themselves.
"""
