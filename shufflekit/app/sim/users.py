"""The clients of a simulated deployment: each round's users, the real client agents over one
shared connection, each answering once at a random time and resending until mix 0's receipt
comes, and (`hostile_clients`) a few that send a second report or another's onion.

What each client sent and when it was receipted goes to the round's facts (`RoundFacts`), the
ground truth the invariants judge the release by; each onion goes to `Order`, which tells
whether the mixes permuted it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from shufflekit.app.sim.invariants import Checker, RoundFacts
from shufflekit.app.sim.order import Order
from shufflekit.base.clock import VirtualClock
from shufflekit.base.errors import TransportError
from shufflekit.base.random import SeededRandomness
from shufflekit.client.agent import ClientAgent, randomized_report, seal_report, wrap_envelope
from shufflekit.client.receipts import ReceiptBox
from shufflekit.core.messages import Announcement
from shufflekit.core.topics import Topics
from shufflekit.core.transport.faulty import FaultyBroker, FaultyTransport
from shufflekit.core.wire import decode_report

HOSTILE_CEILING = 0.1  # the largest share of a round's clients that misbehave
CLIENTS = "sim-clients"


class Users:
    """Every round's clients of one seed (`users` at most per round; draws from `rng`)."""

    def __init__(
        self,
        broker: FaultyBroker,
        clock: VirtualClock,
        rng: SeededRandomness,
        checker: Checker,
        order: Order,
        event: Callable[..., None],
        *,
        users: int,
        n_min: int,
        small_rounds: float,
        hostile: bool,
        deployment: str,
    ) -> None:
        self.broker, self.clock, self.rng = broker, clock, rng
        self.checker, self.order, self.event = checker, order, event
        self.users, self.n_min, self.small_rounds = users, n_min, small_rounds
        self.hostile, self.deployment = hostile, deployment
        self.clients: FaultyTransport | None = None
        self.onions: dict[str, list[bytes]] = {}  # round -> honest onions sent so far
        self.hostile_share = rng.fork("hostile").random()  # x HOSTILE_CEILING

    async def _clients_connection(self) -> FaultyTransport:
        while self.clients is None or not self.clients._open:
            conn = self.broker.connect(CLIENTS)
            await conn.connect()
            self.clients = conn
        return self.clients

    async def answer(self, ann: Announcement) -> None:
        """This round's users: each answers once at a random time, retrying until receipted."""
        crng = self.rng.fork(f"clients-{ann.round_id}")
        lo = max(self.n_min, self.users // 4)
        n = lo + crng.randbelow(max(1, self.users - lo + 1))
        size = self.rng.fork(f"size-{ann.round_id}")  # (the other draws stay the seed's)
        if size.random() < self.small_rounds:  # at n_min's edge: a lost report aborts
            n = self.n_min + size.randbelow(self.n_min // 2)
        facts = self.checker.round(ann.round_id)
        facts.users = n
        self.event(CLIENTS, "users", round=ann.round_id, n=n)
        window = max(0.0, ann.seconds_left(self.clock))
        # misbehaving clients draw from their own stream: the honest draws stay the seed's
        hrng = self.rng.fork(f"hostile-{ann.round_id}")
        share = HOSTILE_CEILING * self.hostile_share if self.hostile else 0.0
        async with ReceiptBox(self._clients_connection, ann, CLIENTS, clock=self.clock) as box:
            users: list[Any] = []
            for i in range(n):
                agent = ClientAgent(f"u{i}", crng.randbelow(ann.k), rng=crng)
                arrive = 0.8 * window * crng.random()
                users.append(self._one_user(agent, ann, arrive, box, facts))
                if share and hrng.random() < share:
                    kind = "twice" if hrng.random() < 0.5 else "replay"
                    users.append(self._hostile(kind, agent, ann, arrive, hrng, facts))
            await asyncio.gather(*users)
        self.event(CLIENTS, "receipted", round=ann.round_id, n=box.receipted)

    async def _one_user(
        self,
        agent: ClientAgent,
        ann: Announcement,
        arrive: float,
        box: ReceiptBox,
        facts: RoundFacts,
    ) -> None:
        """One user: arrives, then resends its report until mix 0's receipt comes."""
        await asyncio.sleep(arrive)
        # what the client sends is drawn first and noted (its value is checked against what
        # the round releases), then sealed: the same draws, in the same order, as `envelope`
        report = randomized_report(agent.value, ann, agent.rng)
        facts.sent[agent.client_id] = value = decode_report(report, ann.mechanism, ann.report_size)
        facts.kept += value == agent.value
        onion = seal_report(report, ann, agent.rng)
        self.onions.setdefault(ann.round_id, []).append(onion)  # for replaying clients
        self.order.sent(ann.round_id, onion)
        envelope = wrap_envelope(agent.client_id, onion, ann, agent.credential, box.reply)
        if await box.deliver(envelope, resend=1.0) is not None:
            facts.receipted.setdefault(agent.client_id, self.clock.monotonic())

    async def _hostile(
        self,
        kind: str,
        agent: ClientAgent,
        ann: Announcement,
        arrive: float,
        rng: SeededRandomness,
        facts: RoundFacts,
    ) -> None:
        """A client's misbehaviour beside its honest report, a little after it: `twice`, a
        second, distinct report under its own id (its value counts as sent: only one of the
        two may be counted); `replay`, the onion of a client that answered earlier, under its
        own id (no new value: the onion is counted once, if at all)."""
        await asyncio.sleep(arrive + 0.5 * rng.random())
        onions = self.onions.get(ann.round_id, [])
        if kind == "twice":
            report = randomized_report(agent.value, ann, rng)
            facts.extra_sent.append(decode_report(report, ann.mechanism, ann.report_size))
            onion = seal_report(report, ann, rng)
        elif onions:
            onion = onions[rng.randbelow(len(onions))]
        else:
            return  # nobody answered before it: nothing to replay
        self.order.sent(ann.round_id, onion)
        self.broker.count("hostile_clients")
        self.event(CLIENTS, "hostile", round=ann.round_id, client=agent.client_id, kind=kind)
        envelope = wrap_envelope(agent.client_id, onion, ann, agent.credential, None)
        with contextlib.suppress(TransportError):
            conn = await self._clients_connection()
            await conn.publish(Topics(self.deployment).data(ann.round_id, 0), envelope)
