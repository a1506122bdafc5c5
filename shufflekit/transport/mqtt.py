"""MQTT 5 transport over aiomqtt: QoS 1, bounded in-flight publishes, per-filter routing.

aiomqtt gives one message stream per connection; a dispatcher task routes each message to
every subscription whose filter matches. aiomqtt has no back-pressure of its own, so publishes
are bounded by a semaphore (an unbounded burst of publishes times out).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import uuid
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from urllib.parse import unquote, urlparse

import aiomqtt

from shufflekit.errors import ConfigError, TransportError
from shufflekit.transport.base import Message, Subscription, Transport, topic_matches


@dataclass(frozen=True)
class BrokerAddress:
    """Where the broker is and how to log in: parsed from `mqtt://user:pass@host:port`."""

    host: str
    port: int
    username: str | None = None
    password: str | None = None
    tls: bool = False

    @classmethod
    def parse(cls, url: str) -> BrokerAddress:
        """Parse `mqtt://` (plain) or `mqtts://` (TLS) URLs; ConfigError otherwise."""
        u = urlparse(url)
        if u.scheme not in ("mqtt", "mqtts") or not u.hostname:
            raise ConfigError(f"broker URL must look like mqtt://host:port, got {url!r}")
        tls = u.scheme == "mqtts"
        try:
            port = u.port or (8883 if tls else 1883)
        except ValueError:
            raise ConfigError(f"broker URL has an invalid port: {url!r}") from None
        return cls(
            host=u.hostname,
            port=port,
            username=unquote(u.username) if u.username else None,
            password=unquote(u.password) if u.password else None,
            tls=tls,
        )


class MqttTransport(Transport):
    """A connection to an MQTT 5 broker."""

    def __init__(
        self,
        address: BrokerAddress,
        *,
        client_id: str | None = None,
        tls_context: ssl.SSLContext | None = None,
        max_inflight: int = 100,
        timeout: float = 30.0,
    ) -> None:
        self._address = address
        self._client_id = client_id or f"sk-{uuid.uuid4().hex[:12]}"
        self._tls_context = tls_context
        self._inflight = asyncio.Semaphore(max_inflight)
        self._max_inflight = max_inflight
        self._timeout = timeout
        self._client: aiomqtt.Client | None = None
        self._subs: list[Subscription] = []
        self._dispatcher: asyncio.Task[None] | None = None

    async def connect(self) -> None:
        tls = self._tls_context
        if self._address.tls and tls is None:
            tls = ssl.create_default_context()
        self._client = aiomqtt.Client(
            self._address.host,
            self._address.port,
            username=self._address.username,
            password=self._address.password,
            identifier=self._client_id,
            protocol=aiomqtt.ProtocolVersion.V5,
            tls_context=tls,
            timeout=self._timeout,
            max_inflight_messages=self._max_inflight,
        )
        try:
            await self._client.__aenter__()
        except aiomqtt.MqttError as exc:
            self._client = None
            raise TransportError(
                f"cannot connect to MQTT broker {self._address.host}:{self._address.port}: {exc}"
            ) from exc
        self._dispatcher = asyncio.create_task(self._dispatch(), name=f"mqtt-{self._client_id}")

    async def close(self) -> None:
        if self._dispatcher is not None:
            self._dispatcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._dispatcher
            self._dispatcher = None
        for sub in self._subs:
            sub.end()
        self._subs.clear()
        if self._client is not None:
            client, self._client = self._client, None
            with contextlib.suppress(aiomqtt.MqttError):
                await client.__aexit__(None, None, None)

    def _require(self) -> aiomqtt.Client:
        if self._client is None:
            raise TransportError("MQTT transport is not connected")
        return self._client

    async def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> None:
        client = self._require()
        async with self._inflight:
            try:
                await client.publish(topic, payload, qos=1, retain=retain, timeout=self._timeout)
            except aiomqtt.MqttError as exc:
                raise TransportError(f"publish to {topic!r} failed: {exc}") from exc

    def subscribe(self, topic_filter: str) -> AbstractAsyncContextManager[Subscription]:
        return self._subscription(topic_filter)

    @asynccontextmanager
    async def _subscription(self, topic_filter: str) -> AsyncIterator[Subscription]:
        client = self._require()
        sub = Subscription(topic_filter)
        self._subs.append(sub)
        try:
            await client.subscribe(topic_filter, qos=1, timeout=self._timeout)
        except aiomqtt.MqttError as exc:
            self._subs.remove(sub)
            raise TransportError(f"subscribe to {topic_filter!r} failed: {exc}") from exc
        try:
            yield sub
        finally:
            if sub in self._subs:
                self._subs.remove(sub)
            if self._client is not None and not any(
                s.topic_filter == topic_filter for s in self._subs
            ):
                with contextlib.suppress(aiomqtt.MqttError):
                    await self._client.unsubscribe(topic_filter, timeout=self._timeout)

    async def _dispatch(self) -> None:
        client = self._require()
        try:
            async for m in client.messages:
                payload = m.payload if isinstance(m.payload, bytes | bytearray) else b""
                msg = Message(m.topic.value, bytes(payload))
                for sub in list(self._subs):
                    if topic_matches(sub.topic_filter, msg.topic):
                        sub.deliver(msg)
        except aiomqtt.MqttError:
            for sub in list(self._subs):
                sub.end()
