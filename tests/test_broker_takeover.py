"""No account can hijack a service's session, and no packet is too large, on the broker as
shipped (deploy/mosquitto: two TLS listeners, `clientid_prefixes sk-`, the services' listener
naming each connection after its account, `max_packet_size`).

Issue #14 found that connecting as the shared `client` account with mix 0's (predictable)
client id disconnected mix 0 and, with a clean start, erased its persistent session and the
reports the broker had acknowledged. Here a real round runs with every service on its own
account on the services' listener, and the `client` account tries each way in.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from shufflekit.accountant.ledger import Budget, Ledger
from shufflekit.app.local import LocalDeployment
from shufflekit.app.rounds import RoundParams
from shufflekit.base.errors import TransportError
from shufflekit.core.messages import Announcement
from shufflekit.core.topics import Topics
from shufflekit.core.transport import BrokerAddress, MqttTransport
from shufflekit.core.transport.base import Transport
from shufflekit.core.wire import MAX_PACKET_BYTES
from tests.broker_security import DEPLOY_CONF, SecureBroker, require_secure_broker, secure_broker
from tests.pipeline_helpers import population

pytestmark = [pytest.mark.services, pytest.mark.mqtt]
WAIT = 5.0


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBroker]:
    require_secure_broker()
    with secure_broker(tmp_path_factory.mktemp("takeover-broker")) as b:
        yield b


def conn(
    b: SecureBroker, user: str, *, service: bool = False, client_id: str | None = None
) -> MqttTransport:
    url = b.service_url(user) if service else b.url(user)
    address = BrokerAddress.parse(url, password=b.passwords[user], ca_file=b.pki.ca.cert, env={})
    return MqttTransport(address, client_id=client_id, timeout=WAIT)


def test_the_shipped_limit_is_the_services_limit() -> None:
    text = DEPLOY_CONF.read_text()
    assert f"\nmax_packet_size {MAX_PACKET_BYTES}\n" in text
    assert "\nclientid_prefixes sk-\n" in text
    assert text.count("\nuse_username_as_clientid true\n") == 1


async def test_no_client_connection_can_take_a_service_session(
    broker: SecureBroker, tmp_path: Path
) -> None:
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    ledger.init_budget(Budget("hijack", 10.0, 1e-6, n_min=10, cost_model="ldp"))
    services: dict[str, MqttTransport] = {}

    def connect(name: str) -> Transport:
        if name == "clients":
            return conn(broker, "client")
        services[name] = t = conn(broker, name, service=True)
        return t

    attempts: dict[str, str] = {}

    async def attack(_clients: Transport, ann: Announcement) -> None:
        # the id mix 0 sent (read from the running service), and the one the broker gave it
        sent_id = services["mix0"].client_id
        assert sent_id.startswith("sk-")
        for label, kwargs in {
            "broker's id on the clients' listener": {"client_id": "mix0"},
            "sent id on the clients' listener": {"client_id": sent_id},
            "sent id on the services' listener": {"client_id": sent_id, "service": True},
            "broker's id on the services' listener": {"client_id": "mix0", "service": True},
        }.items():
            hijacker = conn(broker, "client", **kwargs)  # type: ignore[arg-type]
            try:
                await hijacker.connect()
            except TransportError as exc:
                attempts[label] = f"refused: {exc}"
                continue
            attempts[label] = "connected"
            await asyncio.sleep(0.2)  # a takeover would cut mix 0 now
            assert services["mix0"].connected, label  # its session is not mix 0's
            await hijacker.close()
        topic = Topics(ann.deployment).data(ann.round_id, 0)
        async with conn(broker, "client") as late:
            await late.publish(topic, b"\x00junk after the attempts")

    dep = LocalDeployment(connect, "hijack", ledger, mixes=2, batch_timeout=10.0)
    pop, _ = population(60, k=4)
    params = RoundParams(k=4, eps0=2.0, n_min=10, deadline_seconds=30)
    rep = await asyncio.wait_for(dep.run_round(params, pop, tamper=attack), 90)
    assert attempts["broker's id on the clients' listener"].startswith("refused"), attempts
    assert attempts["broker's id on the services' listener"].startswith("refused"), attempts
    # harmless: a session of its own (the id it sent, or `client` on the services' listener)
    assert attempts["sent id on the clients' listener"] == "connected", attempts
    assert attempts["sent id on the services' listener"] == "connected", attempts
    assert rep.released and rep.result is not None, (rep.abort, attempts)
    assert rep.result.batch_size == 60  # every report counted: mix 0 was never cut off
    assert rep.mixes[0].counters.rejected == {"bad_version": 1}  # the junk, after the attempts
    log = broker.log.read_text(errors="replace")
    assert "as mix0 (" in log  # the broker named mix 0's connection after its account


async def test_a_packet_over_the_limit_disconnects_its_sender(broker: SecureBroker) -> None:
    topics = Topics("limits")
    async with (
        conn(broker, "mix0", service=True) as mix0,
        conn(broker, "client") as client,
        mix0.subscribe(topics.data("r1", 0)) as sub,
    ):
        with pytest.raises(TransportError):
            await client.publish(topics.data("r1", 0), bytes(MAX_PACKET_BYTES + 1))
        async with conn(broker, "client") as other:
            await other.publish(topics.data("r1", 0), b"small")
        assert (await sub.get(WAIT)).payload == b"small"  # the large one never came
