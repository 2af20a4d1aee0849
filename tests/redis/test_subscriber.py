"""Subscriber and Watch on a real server: delivery, retirement, and recovery after a kill."""

from __future__ import annotations

import logging
from typing import Any

import anyio
import pytest

from lovely_coordinator._redis.subscriber import Subscriber, Watch, text

from .helpers import anyio_backend

__all__ = ["anyio_backend"]  # a fixture

pytestmark = pytest.mark.anyio


class Recorder:
    def __init__(self) -> None:
        self.messages: list[str] = []
        self.resets = 0
        self.changed = anyio.Event()

    def on_message(self, message: str) -> None:
        self.messages.append(message)
        self.changed.set()

    def on_reset(self) -> None:
        self.resets += 1
        self.changed.set()

    async def next_change(self) -> None:
        await self.changed.wait()
        self.changed = anyio.Event()


async def subscribers(client: Any) -> int:
    counts = await client.pubsub_numsub("ch")
    return int(counts[0][1])


def test_text_decodes_bytes_only() -> None:
    assert text(b"caf\xc3\xa9") == "café"
    assert text("x") == "x"


async def test_watch_reset_keeps_a_pending_notification_visible_until_reset() -> None:
    with anyio.fail_after(5):
        watch = Watch(ticket=7)
        watch.event.set()
        await watch.event.wait()  # level-triggered: a notification before the wait counts
        watch.reset()
        assert not watch.event.is_set()
        assert watch.ticket == 7


async def test_delivers_while_active_and_unsubscribes_after(redis_client: Any) -> None:
    with anyio.fail_after(5):
        recorder = Recorder()
        subscriber = Subscriber(redis_client, "ch", recorder.on_message, recorder.on_reset)
        async with subscriber.active(), subscriber.active():  # users are counted
            assert await subscribers(redis_client) == 1
            await redis_client.publish("ch", "hello")
            await recorder.next_change()
        assert recorder.messages == ["hello"]
        assert recorder.resets == 0
        while await subscribers(redis_client):  # noqa: ASYNC110  (server-side state)
            await anyio.sleep(0.005)


async def test_killed_connection_is_reported_and_resubscribed(redis_client: Any) -> None:
    with anyio.fail_after(10):
        recorder = Recorder()
        subscriber = Subscriber(redis_client, "ch", recorder.on_message, recorder.on_reset)
        async with subscriber.active():
            assert await redis_client.client_kill_filter(_type="pubsub") == 1
            while recorder.resets == 0:
                await recorder.next_change()
            while await subscribers(redis_client) == 0:  # noqa: ASYNC110  (server-side state)
                await anyio.sleep(0.01)
            await redis_client.publish("ch", "again")
            while "again" not in recorder.messages:
                await recorder.next_change()


async def test_an_unexpected_error_is_survived_like_a_connection_error(
    redis_client: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    with anyio.fail_after(10):
        # Fault injection on the real client: its first PubSub fails with an error that is
        # neither a RedisError nor an OSError (as asyncio's "readuntil() called while
        # another coroutine is already waiting" would).
        make_pubsub = redis_client.pubsub
        made = 0

        def pubsub() -> Any:
            nonlocal made
            made += 1
            real = make_pubsub()
            if made == 1:

                async def broken(*channels: str) -> None:
                    raise RuntimeError("readuntil() called while another coroutine is waiting")

                real.subscribe = broken
            return real

        monkeypatch.setattr(redis_client, "pubsub", pubsub)
        recorder = Recorder()
        subscriber = Subscriber(redis_client, "ch", recorder.on_message, recorder.on_reset)
        with caplog.at_level(logging.WARNING, "lovely_coordinator.redis"):
            async with subscriber.active():  # returns: the first attempt failed
                assert recorder.resets >= 1  # waiters were told to re-check
                while await subscribers(redis_client) == 0:  # noqa: ASYNC110  (server-side)
                    await anyio.sleep(0.01)
                await redis_client.publish("ch", "still listening")
                while "still listening" not in recorder.messages:
                    await recorder.next_change()
        assert "readuntil()" in caplog.text
