"""In-memory bus: the embedded default for demos, simulation and unit tests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager

from shufflekit.base.errors import TransportError
from shufflekit.core.transport.base import (
    Message,
    Subscription,
    Transport,
    check_publish,
    topic_matches,
)


class MemoryBroker:
    """A process-local broker with MQTT-style topic filters and retained messages."""

    def __init__(self) -> None:
        self._subs: list[Subscription] = []
        self._retained: dict[str, bytes] = {}

    def connect(self) -> MemoryTransport:
        """A new client connection to this broker."""
        return MemoryTransport(self)

    def _publish(self, topic: str, payload: bytes, retain: bool) -> None:
        if retain:
            if payload:
                self._retained[topic] = payload
            else:
                self._retained.pop(topic, None)
        msg = Message(topic, payload)
        for sub in list(self._subs):
            if topic_matches(sub.topic_filter, topic):
                sub.deliver(msg)

    def _add(self, sub: Subscription) -> None:
        self._subs.append(sub)
        for topic, payload in self._retained.items():
            if topic_matches(sub.topic_filter, topic):
                sub.deliver(Message(topic, payload))

    def _remove(self, sub: Subscription) -> None:
        if sub in self._subs:
            self._subs.remove(sub)


class MemoryTransport(Transport):
    """One connection to a `MemoryBroker`."""

    def __init__(self, broker: MemoryBroker) -> None:
        self._broker = broker
        self._open = False
        self._subs: list[Subscription] = []

    async def connect(self) -> None:
        self._open = True

    async def close(self) -> None:
        self._open = False
        for sub in self._subs:
            self._broker._remove(sub)
            sub.end()
        self._subs.clear()

    async def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> None:
        if not self._open:
            raise TransportError("publish on a closed in-memory connection")
        self._broker._publish(topic, check_publish(topic, payload), retain)
        await asyncio.sleep(0)  # let subscribers run, as a network would

    def subscribe(self, topic_filter: str) -> AbstractAsyncContextManager[Subscription]:
        return self._subscription(topic_filter)

    @asynccontextmanager
    async def _subscription(self, topic_filter: str) -> AsyncIterator[Subscription]:
        if not self._open:
            raise TransportError("subscribe on a closed in-memory connection")
        sub = Subscription(topic_filter)
        self._subs.append(sub)
        self._broker._add(sub)
        try:
            yield sub
        finally:
            self._broker._remove(sub)
            if sub in self._subs:
                self._subs.remove(sub)
