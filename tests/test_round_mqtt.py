"""The same rounds over a real Mosquitto broker started by the test on a free loopback port."""

from __future__ import annotations

import pytest

from shufflekit.accountant.ledger import Ledger
from shufflekit.app.local import LocalDeployment
from shufflekit.app.rounds import RoundParams
from shufflekit.core.messages import Announcement
from shufflekit.core.transport import BrokerAddress, MqttTransport
from shufflekit.core.transport.base import Transport
from tests.pipeline_helpers import hostile_traffic, population

pytestmark = pytest.mark.mqtt


def mqtt_deployment(url: str, ledger: Ledger, mixes: int) -> LocalDeployment:
    addr = BrokerAddress.parse(url)
    return LocalDeployment(lambda name: MqttTransport(addr, client_id=None), "test", ledger, mixes)


@pytest.mark.parametrize("mixes", [1, 2])
async def test_round_over_mosquitto(mosquitto: str, ledger: Ledger, mixes: int) -> None:
    dep = mqtt_deployment(mosquitto, ledger, mixes)
    pop, _ = population(1500, k=5)
    rep = await dep.run_round(RoundParams(k=5, eps0=2.0, n_min=10, deadline_seconds=60), pop)
    assert rep.released and rep.result is not None
    assert rep.result.batch_size == 1500 == sum(rep.result.histogram)
    assert rep.rejected() == {}
    assert [r.status for r in ledger.status("test").rounds] == ["committed"]


async def test_attacks_over_mosquitto(mosquitto: str, ledger: Ledger) -> None:
    dep = mqtt_deployment(mosquitto, ledger, 2)
    pop, _ = population(200, k=4)
    expected: dict[str, int] = {}

    async def tamper(conn: Transport, ann: Announcement) -> None:
        expected.update(await hostile_traffic(conn, ann))

    rep = await dep.run_round(RoundParams(k=4, eps0=2.0, n_min=10), pop, tamper=tamper)
    assert rep.result is not None and rep.result.batch_size == 201
    assert rep.mixes[0].counters.as_dict() == expected


async def test_below_n_min_over_mosquitto(mosquitto: str, ledger: Ledger) -> None:
    dep = mqtt_deployment(mosquitto, ledger, 1)
    pop, _ = population(5, k=4)
    rep = await dep.run_round(RoundParams(k=4, eps0=2.0, n_min=10), pop)
    assert not rep.released and rep.abort is not None
    assert [r.status for r in ledger.status("test").rounds] == ["refunded"]


def test_broker_url_parsing() -> None:
    a = BrokerAddress.parse("mqtts://u:p%40ss@broker.example:8884")
    assert (a.host, a.port, a.username, a.password, a.tls) == (
        "broker.example",
        8884,
        "u",
        "p@ss",
        True,
    )
    assert BrokerAddress.parse("mqtt://127.0.0.1").port == 1883
    from shufflekit.base.errors import ConfigError

    for bad in ("http://x", "mqtt://", "mqtt://h:notaport"):
        with pytest.raises(ConfigError):
            BrokerAddress.parse(bad)
