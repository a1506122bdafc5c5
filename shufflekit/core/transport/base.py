"""One async publish/subscribe interface for every component, whatever carries the bytes.

Topics and wildcards follow MQTT (`+` one level, `#` the rest), so the in-memory bus and a real
broker behave alike. Delivery is at-least-once: components de-duplicate.
"""

from __future__ import annotations

import abc
import asyncio
import functools
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass

from shufflekit.base.clock import Clock, system_clock
from shufflekit.base.closing import AsyncClosing
from shufflekit.base.errors import InvalidInput, TransportError
from shufflekit.core.waiting import within


@dataclass(frozen=True)
class Message:
    """A delivered message."""

    topic: str
    payload: bytes


def check_publish(topic: object, payload: object) -> bytes:
    """The payload as bytes, if `topic` is a topic one may publish to (a non-empty string
    without the wildcards + and #) and `payload` is bytes-like; InvalidInput otherwise, as
    MQTT would refuse it, the in-memory bus included."""
    if not isinstance(topic, str) or not topic or "+" in topic or "#" in topic:
        raise InvalidInput(f"cannot publish to {topic!r}: a topic is a name without + or #")
    if not isinstance(payload, bytes | bytearray | memoryview):
        raise InvalidInput(f"a payload is bytes, got {type(payload).__name__}")
    return bytes(payload)


MATCHES_CACHED = 1 << 14  # (filter, topic) answers kept: a broker asks the same pairs again


@functools.lru_cache(maxsize=MATCHES_CACHED)
def topic_matches(topic_filter: str, topic: str) -> bool:
    """MQTT topic filter matching (`+` matches one level, a final `#` matches the rest).

    Remembered per (filter, topic): the simulated broker asks it of every session's filters
    for every publish (the chaos sweeps' hottest call), and the answer never changes."""
    f_parts = topic_filter.split("/")
    t_parts = topic.split("/")
    for i, f in enumerate(f_parts):
        if f == "#":
            return i == len(f_parts) - 1
        if i >= len(t_parts) or (f != "+" and f != t_parts[i]):
            return False
    return len(f_parts) == len(t_parts)


class Subscription:
    """Messages matching one topic filter, in arrival order."""

    def __init__(self, topic_filter: str) -> None:
        self.topic_filter = topic_filter
        self._queue: asyncio.Queue[Message | None] = asyncio.Queue()

    def deliver(self, message: Message) -> None:
        """Called by the transport for each matching message."""
        self._queue.put_nowait(message)

    def end(self) -> None:
        """Called by the transport when the connection ends: iteration stops."""
        self._queue.put_nowait(None)

    async def get(self, timeout: float | None = None, *, clock: Clock = system_clock) -> Message:
        """Next message; TimeoutError after `timeout` seconds of `clock`, TransportError if
        closed."""
        msg = await within(self._queue.get(), timeout, clock)
        if msg is None:
            self._queue.put_nowait(None)
            raise TransportError(f"subscription {self.topic_filter!r} closed")
        return msg

    def __aiter__(self) -> AsyncIterator[Message]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Message]:
        while True:
            msg = await self._queue.get()
            if msg is None:
                self._queue.put_nowait(None)
                return
            yield msg


class Transport(AsyncClosing, abc.ABC):
    """A connection to a publish/subscribe bus; use as `async with transport: ...`."""

    @abc.abstractmethod
    async def connect(self) -> None:
        """Open the connection."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Close the connection; open subscriptions end."""

    @abc.abstractmethod
    async def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> None:
        """Publish at least once (QoS 1 on MQTT); returns when the bus has accepted it."""

    @abc.abstractmethod
    def subscribe(self, topic_filter: str) -> AbstractAsyncContextManager[Subscription]:
        """Subscribe; the subscription is active when the context is entered."""

    async def __aenter__(self) -> Transport:
        await self.connect()
        return self


def drain(sub: Subscription) -> list[Message]:
    """Messages already delivered to `sub` and not yet read, without waiting."""
    out: list[Message] = []
    q = sub._queue
    while not q.empty():
        msg = q.get_nowait()
        if msg is None:
            q.put_nowait(None)
            break
        out.append(msg)
    return out
