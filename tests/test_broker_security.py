"""The broker's security, as deployed: deploy/mosquitto's TLS listener, accounts and ACL.

Mosquitto runs deploy/mosquitto/mosquitto.conf (paths and port replaced) with the ACL file as
shipped, on a free loopback port, with certificates generated here. Every "nothing arrives"
check has a positive control in the same window: a message the same connection may read,
published after the forbidden one, arrives first, so the forbidden one would have arrived
before it (Mosquitto handles publishes in order and delivers to a connection in that order).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest

from shufflekit.accountant.ledger import Budget, Ledger
from shufflekit.app.loadtest.plan import connection_id
from shufflekit.app.local import LocalDeployment
from shufflekit.app.rounds import RoundParams
from shufflekit.base.errors import TransportError
from shufflekit.core.receipts import receipt_topic
from shufflekit.core.topics import Topics
from shufflekit.core.transport import BrokerAddress, MqttTransport, Subscription, drain
from shufflekit.core.transport.mqtt import BrokerAccessDenied, BrokerAuthError, BrokerTLSError
from tests.broker_security import (
    SecureBroker,
    make_pki,
    require_secure_broker,
    secure_broker,
)
from tests.pipeline_helpers import population

pytestmark = [pytest.mark.services, pytest.mark.mqtt]

WAIT = 5.0  # seconds a positive control may take; it normally takes milliseconds


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBroker]:
    """Mosquitto with deploy/mosquitto's config and ACL, and an account per role."""
    require_secure_broker()
    with secure_broker(tmp_path_factory.mktemp("secure-broker")) as b:
        yield b


def transport(
    b: SecureBroker,
    role: str | None,
    *,
    password: str | None = None,
    ca_file: Path | None = None,
    host: str = "127.0.0.1",
) -> MqttTransport:
    """A connection as `role` (its own password unless given), trusting the test CA."""
    address = BrokerAddress.parse(
        b.url(role, host),
        password=password if password is not None else b.passwords.get(role or ""),
        ca_file=ca_file or b.pki.ca.cert,
        env={},
    )
    return MqttTransport(address, timeout=WAIT)


async def first(sub: Subscription) -> bytes:
    """The payload of the next message on `sub` (fails after WAIT seconds)."""
    return (await sub.get(WAIT)).payload


async def connect_all(
    stack: AsyncExitStack, b: SecureBroker, roles: Sequence[str]
) -> dict[str, MqttTransport]:
    """One connection per role, opened concurrently (each TLS login takes tens of ms)."""
    conns = {r: transport(b, r) for r in roles}
    await asyncio.gather(*(stack.enter_async_context(c) for c in conns.values()))
    return conns


def fresh_topics() -> tuple[Topics, str]:
    """Topics of a deployment and round no other test uses (retained messages stay apart)."""
    return Topics(f"sec-{uuid.uuid4().hex[:8]}"), "r1"


# ----------------------------------------------------------------------------- TLS and login


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
async def test_tls_login_with_the_generated_ca(broker: SecureBroker, host: str) -> None:
    topics, _ = fresh_topics()
    async with (
        transport(broker, "coordinator", host=host) as coord,
        transport(broker, "client", host=host) as client,
        client.subscribe(topics.announce) as sub,
    ):
        await coord.publish(topics.announce, b"round r1")
        assert await first(sub) == b"round r1"


async def test_wrong_ca_fails_the_handshake(broker: SecureBroker) -> None:
    with pytest.raises(BrokerTLSError, match="not trusted") as err:
        async with transport(broker, "client", ca_file=broker.pki.wrong_ca.cert):
            pass
    assert str(broker.pki.wrong_ca.cert) in str(err.value)
    assert broker.passwords["client"] not in str(err.value)


async def test_plain_url_to_the_tls_port_fails_at_once(broker: SecureBroker) -> None:
    """mqtt:// against the TLS listener: a hint to use mqtts://, not a 30 s timeout."""
    address = BrokerAddress.parse(
        f"mqtt://client@127.0.0.1:{broker.port}", password=broker.passwords["client"], env={}
    )
    with pytest.raises(TransportError, match="use mqtts://"):
        async with MqttTransport(address, timeout=30):
            pass


async def test_tls_url_to_a_plain_port_is_a_tls_error(mosquitto: str, tmp_path: Path) -> None:
    """mqtts:// against a plain listener (conftest's broker) fails the handshake clearly."""
    ca = make_pki(tmp_path).ca.cert
    address = BrokerAddress.parse(mosquitto.replace("mqtt://", "mqtts://"), ca_file=ca, env={})
    with pytest.raises(BrokerTLSError, match="TLS listener"):
        async with MqttTransport(address, timeout=30):
            pass


async def test_client_certificate_is_presented(broker: SecureBroker) -> None:
    """A client certificate and key load and the TLS connection works with them."""
    address = BrokerAddress.parse(
        broker.url("client"),
        password=broker.passwords["client"],
        ca_file=broker.pki.ca.cert,
        cert_file=broker.pki.client.cert,
        key_file=broker.pki.client.key,
        env={},
    )
    topics, rid = fresh_topics()
    async with MqttTransport(address, timeout=WAIT) as client:
        await client.publish(topics.data(rid, 0), b"report")


@pytest.mark.parametrize(
    ("user", "password"),
    [("client", "not-the-password"), ("nobody", "whatever-it-is"), (None, "")],
    ids=["wrong-password", "unknown-user", "anonymous"],
)
async def test_refused_login(broker: SecureBroker, user: str | None, password: str) -> None:
    with pytest.raises(BrokerAuthError, match="not authorized") as err:
        async with transport(broker, user, password=password):
            pass
    if password:
        assert password not in str(err.value)
    # the right password works (the refusal is about the credentials, not the connection)
    async with transport(broker, "client"):
        pass


# ----------------------------------------------------------------------------- the cases


async def test_client_cannot_publish_to_a_mix_output(broker: SecureBroker) -> None:
    """What the publisher sees: PUBACK "Not authorized" (MQTT 5), raised as BrokerAccessDenied;
    mix 1, subscribed to its input, never gets the forged chunk."""
    topics, rid = fresh_topics()
    async with AsyncExitStack() as stack:
        c = await connect_all(stack, broker, ["client", "mix0", "mix1"])
        mix1_in = await stack.enter_async_context(c["mix1"].subscribe(topics.data(rid, 1)))
        mix0_in = await stack.enter_async_context(c["mix0"].subscribe(topics.data(rid, 0)))
        with pytest.raises(BrokerAccessDenied, match="Not authorized") as err:
            await c["client"].publish(topics.data(rid, 1), b"forged chunk")
        assert err.value.topic == topics.data(rid, 1)
        await c["mix0"].publish(topics.data(rid, 1), b"real chunk")
        assert await first(mix1_in) == b"real chunk"  # the forged chunk would have come first
        assert drain(mix1_in) == []
        # the client keeps its connection (deploy's max_queued_messages is not 0)
        await c["client"].publish(topics.data(rid, 0), b"report")
        assert await first(mix0_in) == b"report"


async def test_client_cannot_read_the_analyzer_input(broker: SecureBroker) -> None:
    """Even subscribed to the whole deployment, a client gets the result but not hop L's batch."""
    topics, rid = fresh_topics()
    async with AsyncExitStack() as stack:
        c = await connect_all(stack, broker, ["client", "mix1", "analyzer"])
        everything = await stack.enter_async_context(c["client"].subscribe(f"{topics.prefix}/#"))
        hop2 = await stack.enter_async_context(c["client"].subscribe(topics.data(rid, 2)))
        analyzer_in = await stack.enter_async_context(c["analyzer"].subscribe(topics.data(rid, 2)))
        await c["mix1"].publish(topics.data(rid, 2), b"final batch")
        await c["mix1"].publish(topics.manifest(rid, 2), b"final manifest")
        assert await first(analyzer_in) == b"final batch"
        await c["analyzer"].publish(topics.result(rid), b"histogram")
        assert await first(everything) == b"histogram"  # nothing of hop 2 came before it
        assert drain(everything) == [] and drain(hop2) == []


async def test_mix1_cannot_read_hop0(broker: SecureBroker) -> None:
    """Only mix 0 sees the clients' envelopes (who sent what)."""
    topics, rid = fresh_topics()
    async with AsyncExitStack() as stack:
        c = await connect_all(stack, broker, ["client", "mix0", "mix1"])
        mix0_in = await stack.enter_async_context(c["mix0"].subscribe(topics.data(rid, 0)))
        spy = await stack.enter_async_context(c["mix1"].subscribe(topics.data(rid, 0)))
        mix1_in = await stack.enter_async_context(c["mix1"].subscribe(topics.data(rid, 1)))
        await c["client"].publish(topics.data(rid, 0), b"envelope")
        assert await first(mix0_in) == b"envelope"
        await c["mix0"].publish(topics.data(rid, 1), b"chunk")
        assert await first(mix1_in) == b"chunk"  # the envelope would have reached mix 1 first
        assert drain(spy) == []


async def test_client_reads_announcement_and_result(broker: SecureBroker) -> None:
    topics, rid = fresh_topics()
    async with AsyncExitStack() as stack:
        c = await connect_all(stack, broker, ["client", "coordinator", "analyzer"])
        await c["coordinator"].publish(topics.announce, b"announcement", retain=True)
        ann = await stack.enter_async_context(c["client"].subscribe(topics.announce))
        res = await stack.enter_async_context(c["client"].subscribe(topics.result(rid)))
        assert await first(ann) == b"announcement"  # retained: read after the fact
        await c["analyzer"].publish(topics.result(rid), b"result")
        assert await first(res) == b"result"


# ----------------------------------------------------------------------------- the whole ACL


@dataclass(frozen=True)
class Rule:
    """Who may write and read one topic of a round (deploy/mosquitto/acl, L = 2)."""

    kind: str
    writers: frozenset[str]
    readers: frozenset[str]


ROLES = ("client", "mix0", "mix1", "analyzer", "coordinator")
SERVICES = frozenset({"mix0", "mix1", "analyzer"})
RULES = [
    Rule("prepare", frozenset({"coordinator"}), SERVICES),
    Rule("ready", SERVICES, frozenset({"coordinator"})),
    Rule("announce", frozenset({"coordinator"}), frozenset(ROLES)),
    Rule("hop0-data", frozenset({"client"}), frozenset({"mix0"})),
    Rule("hop0-manifest", frozenset(), frozenset()),
    Rule("hop1-data", frozenset({"mix0"}), frozenset({"mix1"})),
    Rule("hop1-manifest", frozenset({"mix0"}), frozenset({"mix1"})),
    Rule("hop2-data", frozenset({"mix1"}), frozenset({"analyzer"})),
    Rule("hop2-manifest", frozenset({"mix1"}), frozenset({"analyzer"})),
    # mix 0 closes through the broker too, behind its session's backlog (docs/simulation.md)
    Rule("close", frozenset({"coordinator", "mix0"}), SERVICES),
    Rule("go_request", frozenset({"mix0", "mix1"}), frozenset({"coordinator"})),
    Rule("go", frozenset({"coordinator"}), frozenset({"mix0", "mix1"})),
    Rule("abort", SERVICES | {"coordinator"}, SERVICES | {"coordinator"}),
    Rule("result", frozenset({"analyzer"}), frozenset({"client", "coordinator"})),
]


def topic_of(topics: Topics, rid: str, kind: str) -> str:
    """The topic of `kind` in round `rid` (prepare and ready: the coordinator's handshake)."""
    if kind == "prepare":
        return f"{topics.prefix}/prepare"
    if kind == "ready":
        return f"{topics.prefix}/round/{rid}/ready"
    if kind.startswith("hop"):
        hop, what = kind[3:].split("-")
        return topics.data(rid, int(hop)) if what == "data" else topics.manifest(rid, int(hop))
    return topics.announce if kind == "announce" else str(getattr(topics, kind)(rid))


@pytest.mark.parametrize("rule", RULES, ids=[r.kind for r in RULES])
async def test_acl_matrix(broker: SecureBroker, rule: Rule) -> None:
    """Every role against one topic: exactly the ACL's writers publish, its readers receive."""
    topics, rid = fresh_topics()
    topic = topic_of(topics, rid, rule.kind)
    async with AsyncExitStack() as stack:
        conns = await connect_all(stack, broker, ROLES)
        subs = {r: await stack.enter_async_context(conns[r].subscribe(topic)) for r in ROLES}
        # every role reads the announcement: the end-of-window marker on each connection
        marks = {
            r: await stack.enter_async_context(conns[r].subscribe(topics.announce))
            for r in ROLES
            if rule.kind != "announce"
        }
        for role in ROLES:
            if role in rule.writers:
                await conns[role].publish(topic, role.encode())
            else:
                with pytest.raises(BrokerAccessDenied):
                    await conns[role].publish(topic, b"forbidden " + role.encode())
        if marks:
            await conns["coordinator"].publish(topics.announce, b"mark")
        for role in ROLES:
            if role in rule.readers:
                got = [await first(subs[role]) for _ in rule.writers]
                assert sorted(got) == sorted(w.encode() for w in rule.writers), role
            if role in marks:
                assert await first(marks[role]) == b"mark"
            assert drain(subs[role]) == [], f"{role} read {rule.kind} (or a forbidden write)"


async def test_receipts_reach_only_the_connection_they_name(broker: SecureBroker) -> None:
    """Only mix 0 writes receipts, and a receipt topic is readable by the one connection whose
    MQTT client id it names (`pattern read ... %c`), not by another of the same account."""
    topics, _ = fresh_topics()
    async with AsyncExitStack() as stack:
        c = await connect_all(stack, broker, ["client", "mix0"])
        other = transport(broker, "client")
        await stack.enter_async_context(other)
        own_topic = receipt_topic(topics.deployment, c["client"].client_id)
        mine = await stack.enter_async_context(c["client"].subscribe(own_topic))
        snooped = await stack.enter_async_context(other.subscribe(own_topic))
        control = await stack.enter_async_context(
            other.subscribe(receipt_topic(topics.deployment, other.client_id))
        )
        for forger in (c["client"], other):
            with pytest.raises(BrokerAccessDenied):
                await forger.publish(own_topic, b"forged receipt")
        await c["mix0"].publish(own_topic, b"receipt")
        await c["mix0"].publish(receipt_topic(topics.deployment, other.client_id), b"control")
        assert await first(mine) == b"receipt"
        assert await first(control) == b"control"  # the snooped one would have come first
        assert drain(snooped) == [] and drain(mine) == []


async def test_the_load_generators_connections_are_admitted_and_get_their_receipts(
    broker: SecureBroker,
) -> None:
    """`shufflekit loadtest --config` drives a deployment on the shipped broker, which admits
    only client ids starting `sk-` (`clientid_prefixes`): its connections, named `lt-...`,
    were refused at login. Each connection's id is also its receipt reply id: mix 0's receipt
    to it must arrive."""
    topics, _ = fresh_topics()
    address = BrokerAddress.parse(
        broker.url("client"), password=broker.passwords["client"], ca_file=broker.pki.ca.cert,
        env={},
    )  # fmt: skip
    reply = connection_id(3)
    async with AsyncExitStack() as stack:
        (mix0,) = (await connect_all(stack, broker, ["mix0"])).values()
        load = await stack.enter_async_context(
            MqttTransport(address, client_id=reply, timeout=WAIT)
        )
        mine = await stack.enter_async_context(
            load.subscribe(receipt_topic(topics.deployment, reply))
        )
        await mix0.publish(receipt_topic(topics.deployment, reply), b"receipt")
        assert await first(mine) == b"receipt"


# ----------------------------------------------------------------------------- a real round


async def test_two_mix_round_with_role_accounts(broker: SecureBroker, tmp_path: Path) -> None:
    """The shipped ACL admits everything a 2-mix round does, each role on its own account."""
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    ledger.init_budget(
        Budget("secure", epsilon_total=10.0, delta_total=1e-6, n_min=10, cost_model="ldp")
    )
    accounts = {"clients": "client"}  # LocalDeployment's connection names -> accounts

    def connect(name: str) -> MqttTransport:
        return transport(broker, accounts.get(name, name))

    dep = LocalDeployment(connect, "secure", ledger, mixes=2, batch_timeout=10.0)
    pop, _ = population(60, k=4)
    rep = await asyncio.wait_for(
        dep.run_round(RoundParams(k=4, eps0=2.0, n_min=10, deadline_seconds=30), pop), 60
    )
    assert rep.released and rep.result is not None, rep.abort
    assert rep.result.batch_size == 60 == sum(rep.result.histogram)
