"""A hop's durable input over real Mosquitto is acknowledged (PUBACK) only by `ack()`, once
spooled: a message the hop received but did not ack comes again when its persistent session
resumes, and one it acked does not. Acked on arrival (the core mutation audit's surviving
mutant, which no kill -9 test caught), a hop killed before its commit loses it for good."""

from __future__ import annotations

import asyncio
import uuid

from shufflekit.core.transport import BrokerAddress, MqttTransport
from shufflekit.core.transport.base import Message, Subscription

TOPIC = f"shufflekit/ack-{uuid.uuid4().hex[:8]}/round/r1/hop/0/data"  # no other test's
PAYLOADS = [bytes([i]) * 32 for i in range(3)]


def _hop(url: str, client_id: str) -> MqttTransport:
    return MqttTransport(
        BrokerAddress.parse(url),
        client_id=client_id,
        session_expiry=300,
        durable_filters=[TOPIC],
        timeout=10,
    )


async def _received(sub: Subscription, count: int, wait: float) -> list[Message]:
    out: list[Message] = []
    try:
        while len(out) < count:
            out.append(await asyncio.wait_for(sub.get(), wait))
    except TimeoutError:
        pass
    return out


async def test_only_acked_input_is_forgotten_by_the_broker(mosquitto: str) -> None:
    client_id = f"hop-{uuid.uuid4().hex[:8]}"
    async with _hop(mosquitto, client_id) as hop, hop.subscribe(TOPIC) as sub:
        async with MqttTransport(BrokerAddress.parse(mosquitto), timeout=10) as sender:
            for p in PAYLOADS:
                await sender.publish(TOPIC, p)
        first = await _received(sub, len(PAYLOADS), 10)
        assert [m.payload for m in first] == PAYLOADS  # received, none acked
    async with _hop(mosquitto, client_id) as hop, hop.subscribe(TOPIC) as sub:
        again = await _received(sub, len(PAYLOADS), 10)  # the session resumes: sent again
        assert sorted(m.payload for m in again) == PAYLOADS
        for m in again:
            hop.ack(m)
        await asyncio.sleep(0.5)  # the PUBACKs reach the broker
    async with _hop(mosquitto, client_id) as hop, hop.subscribe(TOPIC) as sub:
        assert await _received(sub, 1, 2) == []  # acked: forgotten
