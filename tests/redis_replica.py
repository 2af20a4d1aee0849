"""A replica process for the cross-process Redis tests (run as a script, never collected).

Each mode connects to the server at ``url``, does its part and reports on stdout, one JSON
object per line, so the test can SIGKILL, SIGSTOP or wait for it at the right moment.

* ``hold URL PREFIX CONV TTL``: acquire the lease, print ``{"fence": n}``, hold it until killed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

import redis.asyncio

from lovely_coordinator.redis import RedisLocker


def report(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


async def hold(args: argparse.Namespace) -> None:
    client = redis.asyncio.Redis.from_url(args.url)
    lease = await RedisLocker(client, ttl=args.ttl, prefix=args.prefix).acquire(args.conv)
    report(fence=lease.fence)
    await asyncio.sleep(3600)


def main() -> None:
    parser = argparse.ArgumentParser()
    modes = parser.add_subparsers(dest="mode", required=True)
    p = modes.add_parser("hold")
    p.add_argument("url")
    p.add_argument("prefix")
    p.add_argument("conv")
    p.add_argument("ttl", type=float)
    args = parser.parse_args()
    asyncio.run({"hold": hold}[args.mode](args))


if __name__ == "__main__":
    main()
