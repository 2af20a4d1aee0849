"""Longer chaos runs of the Redis primitives, by hand; prints a summary table.

    python scripts/chaos.py                      # 3 seeds, 2 minutes each
    python scripts/chaos.py --seconds 600 --seeds 1 2 3 4
    python scripts/chaos.py --faults stall restart --unfenced   # the control experiment
    python scripts/chaos.py --cluster            # the lock server is a 3-node cluster

Each run starts three throwaway servers and replica processes, injects faults (see
``tests/redis/chaos.py``) and checks the oracle: 0 lost updates, 0 writes of a superseded
holder accepted, never more pool holders than the limit while their permits could be shown
held, no closure shortened, never more fleet calls in flight than the fleet's limit, and
never more tokens admitted by the fleet than its bucket allowed. The exit status is 1 if
any run broke a promise (with ``--unfenced``: if any run lost *no* update, as the oracle
would then be blind). The replicas' logs go to a file in the temporary directory, named at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the tests package

from tests.redis.chaos import (
    CLUSTER_FAULTS,
    FAULTS,
    ChaosConfig,
    ChaosReport,
    format_table,
    run_chaos,
)


def main() -> int:
    parser = argparse.ArgumentParser(prog="python scripts/chaos.py")
    parser.add_argument("--seconds", type=float, default=120.0, help="of faults, per run")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--ttl", type=float, default=0.6, help="of leases and permits")
    parser.add_argument("--limit", type=int, default=2, help="of the permit pool and the fleet")
    parser.add_argument(
        "--tokens-per-minute", type=float, default=6000.0, help="the fleet's budget (50 a call)"
    )
    parser.add_argument("--faults", nargs="+", choices=FAULTS, help="default: every kind")
    parser.add_argument("--unfenced", action="store_true", help="plain reads (expect lost updates)")
    kinds_on_cluster = " ".join(CLUSTER_FAULTS)
    parser.add_argument(
        "--cluster", action="store_true", help=f"a 3-node cluster (faults: {kinds_on_cluster})"
    )
    args = parser.parse_args()
    if args.replicas < 2:
        parser.error("--replicas must be at least 2")
    kinds = CLUSTER_FAULTS if args.cluster else FAULTS
    if args.faults is None:
        args.faults = list(kinds)
    elif not set(args.faults) <= set(kinds):
        parser.error(f"on a cluster, the faults are {', '.join(CLUSTER_FAULTS)}")
    reports: list[ChaosReport] = []
    with tempfile.NamedTemporaryFile(
        "w", prefix="lovely-chaos-", suffix=".log", delete=False
    ) as log:
        for seed in args.seeds:
            config = ChaosConfig(
                seed=seed,
                duration=args.seconds,
                replicas=args.replicas,
                ttl=args.ttl,
                limit=args.limit,
                tokens_per_minute=args.tokens_per_minute,
                faults=tuple(args.faults),
                unfenced=args.unfenced,
                cluster=args.cluster,
            )
            print(f"seed {seed}: {args.seconds:g} s of faults ...", flush=True)
            reports.append(asyncio.run(run_chaos(config, stderr=log)))
    print()
    print(format_table(reports))
    print(f"\nfaults injected: {dict(sum((r.faults for r in reports), start=Counter()))}")
    print(f"replica logs: {log.name}")
    if args.unfenced:
        return 0 if all(r.findings.lost_updates for r in reports) else 1
    return 0 if all(r.clean for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
