"""One aiomqtt connection, plus what aiomqtt 2.x has no public API for: the only module that
reaches under aiomqtt (one private attribute, read in `_paho_client`).

`MqttTransport` needs three things aiomqtt 2.x (pinned <3) does not offer:

* the reason code of a PUBACK: under MQTT 5 a broker whose ACL refuses a QoS 1 publish says so
  there, and aiomqtt's `publish()` drops it (the publisher would believe it delivered what
  nobody will receive). Getting it also needs the publish's packet id, which `publish()` does
  not return;
* acknowledging a message by hand (paho's manual ack), so that a durable hop acks only what it
  has spooled;
* hearing the broker hang up before its CONNACK, or while PUBACKs are pending: aiomqtt ignores a
  disconnect before CONNACK and waits its whole timeout (30 s for a plain connection to a TLS
  port), and lets pending publishes wait theirs (a broker restart would stall every publisher).

paho's public API does all three (`publish` returns the packet id, `manual_ack_set`/`ack`, and
the `on_connect`/`on_publish`/`on_disconnect` callbacks, each chained here to the one aiomqtt
installed), on the paho client aiomqtt keeps in its private `_client` attribute. Everything
else goes through aiomqtt's public API (constructor arguments, `subscribe`, `unsubscribe`,
`messages`, the async context manager).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import aiomqtt
import paho.mqtt.client as paho
from paho.mqtt.reasoncodes import ReasonCode

from shufflekit.base.errors import TransportError


class ClosedBeforeConnack(aiomqtt.MqttError):
    """The broker closed the connection before it answered the CONNECT."""


def _paho_client(client: aiomqtt.Client) -> paho.Client:
    """The paho client under `client`: the one private access (see the module docstring)."""
    inner: paho.Client = client._client
    return inner


class MqttLink:
    """An `aiomqtt.Client` (`client`, for subscriptions and the message stream) with QoS 1
    publishes that report the PUBACK's reason code, manual acks, and fast failure when the
    broker hangs up. Build it, then `open()` it; `close()` ends it."""

    def __init__(self, client: aiomqtt.Client, *, manual_ack: bool = False) -> None:
        self.client = client
        self._paho = _paho_client(client)
        self._acks: dict[int, asyncio.Future[ReasonCode | None]] = {}
        self._connack = False
        self._hung_up: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        if manual_ack:
            self._paho.manual_ack_set(True)
        # aiomqtt's own callbacks, which each of ours calls on to
        on_connect: Callable[..., object] | None = self._paho.on_connect
        on_publish: Callable[..., object] | None = self._paho.on_publish
        on_disconnect: Callable[..., object] | None = self._paho.on_disconnect

        def connected(*args: Any) -> None:
            self._connack = True
            if on_connect is not None:
                on_connect(*args)

        def published(
            c: paho.Client, userdata: Any, mid: int, reason_code: ReasonCode, properties: Any
        ) -> None:
            self._acked(mid, reason_code)
            if on_publish is not None:
                on_publish(c, userdata, mid, reason_code, properties)

        def disconnected(
            c: paho.Client, userdata: Any, flags: Any, reason_code: Any, properties: Any = None
        ) -> None:
            self._lost(reason_code)
            if on_disconnect is not None:
                on_disconnect(c, userdata, flags, reason_code, properties)

        self._paho.on_connect = connected
        self._paho.on_publish = published
        self._paho.on_disconnect = disconnected

    async def open(self) -> None:
        """Connect and log in; aiomqtt.MqttError (ClosedBeforeConnack if the broker hung up
        before answering the login) if that fails."""
        entering = asyncio.ensure_future(self.client.__aenter__())
        either: set[asyncio.Future[Any]] = {entering, self._hung_up}
        try:
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            entering.cancel()
            raise
        if entering.done():
            entering.result()
            return
        entering.cancel()  # it would wait for a CONNACK that will never come
        with contextlib.suppress(asyncio.CancelledError, aiomqtt.MqttError):
            await entering
        raise ClosedBeforeConnack(self._hung_up.result())

    async def close(self) -> None:
        """Disconnect (errors of a connection already gone are ignored)."""
        with contextlib.suppress(aiomqtt.MqttError):
            await self.client.__aexit__(None, None, None)

    async def publish_qos1(
        self, topic: str, payload: bytes, *, retain: bool, timeout: float
    ) -> ReasonCode | None:
        """Publish with QoS 1 and wait for the PUBACK; its reason code if it is a failure.
        TransportError if it cannot be sent, no PUBACK comes in time or the connection ends."""
        info = self._paho.publish(topic, payload, qos=1, retain=retain)
        if info.rc != paho.MQTT_ERR_SUCCESS:
            raise TransportError(paho.error_string(info.rc))
        ack: asyncio.Future[ReasonCode | None] = asyncio.get_running_loop().create_future()
        self._acks[info.mid] = ack  # before any await: the PUBACK is read on this loop
        try:
            return await asyncio.wait_for(ack, timeout)
        except TimeoutError:
            raise TransportError("Operation timed out") from None
        finally:
            self._acks.pop(info.mid, None)

    def ack(self, mid: int, qos: int) -> None:
        """Acknowledge a received message (with `manual_ack`)."""
        self._paho.ack(mid, qos)

    def _acked(self, mid: int, reason_code: ReasonCode) -> None:
        ack = self._acks.pop(mid, None)
        if ack is not None and not ack.done():
            failed = isinstance(reason_code, ReasonCode) and reason_code.is_failure
            ack.set_result(reason_code if failed else None)

    def _lost(self, reason_code: Any) -> None:
        if not self._connack and not self._hung_up.done():  # `open` is waiting for it
            self._hung_up.set_result(str(reason_code))
        # Publishes still waiting for their PUBACK will never get it on this connection (a
        # new one is a new client): fail them now, not after the whole timeout, so a
        # publisher reconnects and resends at once when the broker goes away.
        acks, self._acks = self._acks, {}
        for ack in acks.values():
            if not ack.done():
                ack.set_exception(TransportError(f"connection lost ({reason_code})"))
