"""A throwaway Redis Cluster of three primaries, for tests and benchmarks.

Three :class:`~.redis_server.ThrowawayServer` processes in cluster mode (each with its own
cluster-bus port), introduced to one another with ``CLUSTER MEET``, each serving a third
of the 16384 slots (``CLUSTER ADDSLOTSRANGE``); ready once every node reports
``cluster_state:ok``. No replicas: a test that needs one fails over a standalone pair.

As with a standalone server, the cluster's first boot is declared fresh (the run ids of
its three nodes, in the one ``fresh-boot`` key, see ``boot.py``), so nothing waits a quiet
period; :meth:`ThrowawayCluster.flush_node` flushes one node *without* declaring it, a
loss of state in the slots of that node alone.
"""

from __future__ import annotations

import time
from types import TracebackType
from typing import Final, Self, final

import redis
from redis.crc import key_slot

from lovely_coordinator._redis.keys import FRESH_BOOT_KEY

from .redis_server import ThrowawayServer

__all__ = ["SLOTS", "ThrowawayCluster"]

SLOTS: Final = 16384
_READY_TIMEOUT: Final = 20.0


@final
class ThrowawayCluster:
    """Three primaries on loopback, each serving a third of the slots. A sync context manager."""

    def __init__(self, executable: str | None = None, *, size: int = 3) -> None:
        self.nodes = [ThrowawayServer(executable, cluster=True) for _ in range(size)]
        # Node i serves the slots ranges[i][0] .. ranges[i][1] (inclusive).
        self.ranges = [(SLOTS * i // size, SLOTS * (i + 1) // size - 1) for i in range(size)]
        self.moved: dict[int, int] = {}  # slot -> index of the node it was moved to

    @property
    def host(self) -> str:
        return "127.0.0.1"

    @property
    def port(self) -> int:
        """The port of the first node (any node is a start-up node for a client)."""
        return self.nodes[0].port

    def node_of(self, key: str) -> ThrowawayServer:
        """The node that serves ``key``'s slot (after :meth:`move_slot`, where it went)."""
        slot = key_slot(key.encode())
        if slot in self.moved:
            return self.nodes[self.moved[slot]]
        for node, (first, last) in zip(self.nodes, self.ranges, strict=True):
            if first <= slot <= last:
                return node
        raise AssertionError("unreachable")  # pragma: no cover

    def start(self) -> None:
        """Start the nodes, form the cluster, wait until it is ready, declare it fresh.

        Raises:
            RuntimeError: a node did not start, or the cluster was not ready within 20 s.
        """
        for node in self.nodes:
            node.start()
        first = self.nodes[0]
        for node, (low, high) in zip(self.nodes, self.ranges, strict=True):
            node.command("CLUSTER", "ADDSLOTSRANGE", str(low), str(high))
            if node is not first:
                first.command("CLUSTER", "MEET", "127.0.0.1", str(node.port), str(node.bus_port))
        deadline = time.monotonic() + _READY_TIMEOUT
        while not all(self._ready(node) for node in self.nodes):
            if time.monotonic() > deadline:
                raise RuntimeError("the cluster did not reach cluster_state:ok within 20 s")
            time.sleep(0.02)
        self.declare_fresh()

    def _ready(self, node: ThrowawayServer) -> bool:
        info = node.command("CLUSTER", "INFO").decode()
        return (
            "cluster_state:ok" in info
            and f"cluster_known_nodes:{len(self.nodes)}" in info
            and f"cluster_slots_ok:{SLOTS}" in info
        )

    def declare_fresh(self) -> None:
        """Declare the running boots of every node fresh (one key, their run ids)."""
        run_ids = " ".join(node.run_id for node in self.nodes)
        self.node_of(FRESH_BOOT_KEY).command("SET", FRESH_BOOT_KEY, run_ids)

    def flush(self) -> None:
        """Delete every key on every node and declare the boots fresh again."""
        for node in self.nodes:
            node.command("FLUSHALL")
        self.declare_fresh()

    def flush_node(self, node: ThrowawayServer) -> None:
        """Delete every key of one node, declaring nothing: a loss of state in its slots
        (and of the ``fresh-boot`` key, if that node holds it)."""
        node.command("FLUSHALL")

    def move_slot(self, key: str, to: ThrowawayServer) -> None:
        """Move ``key``'s slot, and every key in it, to node ``to`` (a resharding step:
        ``SETSLOT IMPORTING/MIGRATING``, ``MIGRATE``, then ``SETSLOT NODE`` on every node)."""
        slot = key_slot(key.encode())
        source = self.node_of(key)
        source_id, target_id = (n.command("CLUSTER", "MYID").decode() for n in (source, to))
        to.command("CLUSTER", "SETSLOT", str(slot), "IMPORTING", source_id)
        source.command("CLUSTER", "SETSLOT", str(slot), "MIGRATING", target_id)
        with redis.Redis(port=source.port) as client:
            keys = client.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 1000)
            if keys:
                client.execute_command("MIGRATE", "127.0.0.1", to.port, "", 0, 5000, "KEYS", *keys)
        for node in self.nodes:
            node.command("CLUSTER", "SETSLOT", str(slot), "NODE", target_id)
        self.moved[slot] = self.nodes.index(to)

    def close(self) -> None:
        for node in self.nodes:
            node.close()

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
