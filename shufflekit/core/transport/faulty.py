"""An in-memory MQTT 5 broker that misbehaves on a seeded schedule: the simulation's network.

It keeps what a real broker keeps (persistent sessions under fixed client ids, their
subscriptions, QoS 1 messages queued while a client is away and redelivered until a durable
filter's message is acknowledged, retained messages) and loses what a real one loses (a
clean session's messages when it drops; everything in flight when it restarts without
persistence). On top, each delivery may be dropped, duplicated, delayed or overtaken, and a
connection may be cut, with probabilities per link (client id) and per topic. Every decision
is drawn from one seeded `Randomness` and reported to `on_event` (never payload bytes), so a
simulation on a virtual clock replays exactly from its seed.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from shufflekit.base.errors import TransportError
from shufflekit.base.random import Randomness
from shufflekit.core.transport.base import (
    Message,
    Subscription,
    Transport,
    check_publish,
    topic_matches,
)

EventSink = Callable[..., None]
# durable messages a persistent session has delivered and not yet acked, at most (Mosquitto's
# max_inflight_messages): a backlog arrives as fast as the client acks it, in order
INFLIGHT = 20


@dataclass(frozen=True)
class LinkFaults:
    """Probabilities of each fault on one delivery (or, for `drop`, one publish)."""

    drop: float = 0.0  # a publish is lost before the broker takes it: no PUBACK, an error
    duplicate: float = 0.0  # a delivery is made twice (QoS 1 is at least once)
    delay: float = 0.0  # a delivery waits up to `max_delay` seconds
    reorder: float = 0.0  # a delivery waits a little, so later ones overtake it
    disconnect: float = 0.0  # after a delivery the receiving connection is cut
    max_delay: float = 2.0


@dataclass(frozen=True)
class FaultPlan:
    """Which faults apply where: `links` by client id, `topics` by a part of the topic;
    a link's entry wins over a topic's, which wins over `default`."""

    default: LinkFaults = LinkFaults()
    links: dict[str, LinkFaults] = field(default_factory=dict)
    topics: dict[str, LinkFaults] = field(default_factory=dict)

    def on(self, client_id: str, topic: str) -> LinkFaults:
        if client_id in self.links:
            return self.links[client_id]
        for part, faults in self.topics.items():
            if part in topic:
                return faults
        return self.default


@dataclass(frozen=True)
class FaultyMessage(Message):
    """A delivered message with the packet id its acknowledgement names."""

    mid: int = 0


@dataclass
class _Session:
    client_id: str
    persistent: bool
    durable: tuple[str, ...]
    filters: list[str] = field(default_factory=list)  # subscribed at the broker
    unacked: dict[int, FaultyMessage] = field(default_factory=dict)  # durable, delivered
    held: list[FaultyMessage] = field(default_factory=list)  # waiting for a subscription
    # durable messages delivered and not yet acked (at most INFLIGHT), and those queued behind
    inflight: set[int] = field(default_factory=set)
    queued: list[FaultyMessage] = field(default_factory=list)
    conn: FaultyTransport | None = None

    def is_durable(self, topic: str) -> bool:
        return any(topic_matches(f, topic) for f in self.durable)

    def wants(self, topic: str) -> bool:
        return any(topic_matches(f, topic) for f in self.filters)


class FaultyBroker:
    """The broker; `connect` makes client connections, `restart` and `cut` are the faults a
    simulation schedules itself."""

    def __init__(
        self,
        rng: Randomness,
        plan: FaultPlan | None = None,
        *,
        on_event: EventSink | None = None,
        tap: Callable[[str, str, bytes], None] | None = None,
        persistence: bool = True,
    ) -> None:
        self.rng = rng
        self.plan = plan or FaultPlan()
        self.persistence = persistence
        self.round_trip = 0.001  # seconds from an ack to the next queued message's delivery
        self._emit = on_event or (lambda *a, **k: None)
        self._tap = tap  # sees (sender, topic, payload) of every accepted publish: checkers
        self._sessions: dict[str, _Session] = {}
        self._retained: dict[str, bytes] = {}
        self._mids = itertools.count(1)
        self._anonymous = itertools.count(1)
        self.injected: dict[str, int] = {}

    # ------------------------------------------------------------------ faults
    def _chance(self, p: float) -> bool:
        return p > 0 and self.rng.random() < p

    def count(self, kind: str) -> None:
        """Count one fault of `kind` in `injected` (a simulation's own faults count here too)."""
        self.injected[kind] = self.injected.get(kind, 0) + 1

    def _fault(self, kind: str, **fields: Any) -> None:
        self.count(kind)
        self._emit("fault", fault=kind, **fields)

    def cut(self, client_id: str, reason: str = "disconnect") -> bool:
        """Cut the connection of `client_id` (its session stays if persistent); `reason` is
        the fault counted (a role's crash cuts its connection too)."""
        s = self._sessions.get(client_id)
        if s is None or s.conn is None:
            return False
        self._fault(reason, client=client_id)
        s.conn._drop()
        return True

    def restart(self) -> None:
        """Every connection is cut; without persistence every session, queued message and
        retained message is lost too."""
        self._fault("broker_restart", persistence=self.persistence)
        for s in list(self._sessions.values()):
            if s.conn is not None:
                s.conn._drop()
        if not self.persistence:
            self._sessions.clear()
            self._retained.clear()

    # ------------------------------------------------------------------ connections
    def connect(
        self,
        client_id: str | None = None,
        *,
        persistent: bool = False,
        durable_filters: Sequence[str] = (),
    ) -> FaultyTransport:
        """A connection (not yet open); a persistent one finds its session again by id."""
        cid = client_id or f"anon-{next(self._anonymous)}"
        return FaultyTransport(self, cid, persistent and client_id is not None, durable_filters)

    def _attach(self, conn: FaultyTransport) -> None:
        s = self._sessions.get(conn.client_id)
        if s is not None and s.conn is not None:  # MQTT: the newer connection takes over
            s.conn._drop()
        if s is None or not (conn.persistent and s.persistent):
            s = _Session(conn.client_id, conn.persistent, tuple(conn.durable))
            self._sessions[conn.client_id] = s
        s.conn = conn
        s.inflight.clear()  # every unacked message is delivered again, in order
        s.queued.clear()
        redeliver = [s.unacked[m] for m in sorted(s.unacked)]
        s.held = redeliver + [m for m in s.held if m.mid not in s.unacked]
        self._emit("connect", client=conn.client_id, resumed=len(s.held))

    def _detach(self, conn: FaultyTransport) -> None:
        s = self._sessions.get(conn.client_id)
        if s is None or s.conn is not conn:
            return
        s.conn = None
        if not s.persistent:
            del self._sessions[conn.client_id]

    def _subscribe(self, conn: FaultyTransport, sub: Subscription) -> None:
        s = self._sessions[conn.client_id]
        if sub.topic_filter not in s.filters:
            s.filters.append(sub.topic_filter)
        for topic, payload in sorted(self._retained.items()):
            if topic_matches(sub.topic_filter, topic):
                sub.deliver(Message(topic, payload))
        still = []
        for m in s.held:
            if topic_matches(sub.topic_filter, m.topic):
                self._hand(s, conn, m)
            else:
                still.append(m)
        s.held = still

    def _unsubscribe(self, conn: FaultyTransport, sub: Subscription) -> None:
        s = self._sessions.get(conn.client_id)
        if s is None or s.conn is not conn:
            return
        others = any(o.topic_filter == sub.topic_filter for o in conn._subs if o is not sub)
        if not others and sub.topic_filter in s.filters:
            s.filters.remove(sub.topic_filter)

    def _ack(self, conn: FaultyTransport, message: Message) -> None:
        s = self._sessions.get(conn.client_id)
        if s is not None and isinstance(message, FaultyMessage):
            s.unacked.pop(message.mid, None)
            s.inflight.discard(message.mid)
            if s.queued and len(s.inflight) < INFLIGHT:  # the next one, a round trip later
                nxt = s.queued.pop(0)
                s.inflight.add(nxt.mid)
                asyncio.get_running_loop().call_later(self.round_trip, self._next, s, conn, nxt)

    def _next(self, s: _Session, conn: FaultyTransport, msg: FaultyMessage) -> None:
        """A queued durable message's turn has come (its slot is taken)."""
        if s.conn is conn:
            self._hand(s, conn, msg, queued=True)

    # ------------------------------------------------------------------ publish and deliver
    def _publish(self, sender: str, topic: str, payload: bytes, retain: bool) -> None:
        if self._chance(self.plan.on(sender, topic).drop):
            self._fault("drop", client=sender, topic=topic, where="publish")
            raise TransportError(f"no PUBACK for {topic} (the simulated network lost it)")
        if retain:
            if payload:
                self._retained[topic] = payload
            else:
                self._retained.pop(topic, None)
        self._emit("publish", client=sender, topic=topic, retain=retain)
        if self._tap is not None:
            self._tap(sender, topic, payload)
        for s in list(self._sessions.values()):
            if s.wants(topic):
                msg = FaultyMessage(topic, payload, next(self._mids))
                if s.is_durable(topic):
                    s.unacked[msg.mid] = msg
                if s.conn is None:
                    s.held.append(msg)
                else:
                    self._route(s, s.conn, msg)

    def _route(self, s: _Session, conn: FaultyTransport, msg: FaultyMessage) -> None:
        """Deliver now or later, once or twice, as the plan draws."""
        faults = self.plan.on(s.client_id, msg.topic)
        copies = 2 if self._chance(faults.duplicate) else 1
        if copies == 2:
            self._fault("duplicate", client=s.client_id, topic=msg.topic)
        loop = asyncio.get_running_loop()
        for _ in range(copies):
            wait = 0.0
            if self._chance(faults.delay):
                wait = faults.max_delay * self.rng.random()
                self._fault("delay", client=s.client_id, topic=msg.topic, seconds=round(wait, 6))
            elif self._chance(faults.reorder):
                wait = 0.001 + 0.01 * self.rng.random()
                self._fault("reorder", client=s.client_id, topic=msg.topic)
            if wait > 0:
                loop.call_later(wait, self._arrive, s, conn, msg)
            else:
                self._arrive(s, conn, msg)
        if self._chance(faults.disconnect):
            loop.call_soon(self.cut, s.client_id)

    def _arrive(self, s: _Session, conn: FaultyTransport, msg: FaultyMessage) -> None:
        if s.conn is not conn:  # the connection went away in flight
            if s.persistent and s.client_id in self._sessions and msg.mid not in s.unacked:
                s.held.append(msg)  # queued for the session (QoS 1), unless already pending
            elif not s.persistent:
                self._fault("drop", client=s.client_id, topic=msg.topic, where="in flight")
            return
        self._hand(s, conn, msg)

    def _hand(
        self, s: _Session, conn: FaultyTransport, msg: FaultyMessage, queued: bool = False
    ) -> None:
        """Deliver `msg` to the connection's subscriptions (`queued`: its turn in the queue
        of durable messages has come)."""
        subs = [sub for sub in conn._subs if topic_matches(sub.topic_filter, msg.topic)]
        if not subs:  # subscribed at the broker, not yet in this process: hold it
            if s.persistent:
                s.held.append(msg)
            return
        if s.persistent and s.is_durable(msg.topic) and not queued and msg.mid not in s.inflight:
            if s.queued or len(s.inflight) >= INFLIGHT:  # behind the backlog, in order
                s.queued.append(msg)
                return
            s.inflight.add(msg.mid)
        self._emit("deliver", client=s.client_id, topic=msg.topic)
        for sub in subs:
            sub.deliver(msg)


class FaultyTransport(Transport):
    """One connection to a `FaultyBroker` (the `Transport` every role already speaks)."""

    def __init__(
        self, broker: FaultyBroker, client_id: str, persistent: bool, durable: Sequence[str]
    ) -> None:
        self.broker = broker
        self.client_id = client_id
        self.persistent = persistent
        self.durable = list(durable)
        self._open = False
        self._subs: list[Subscription] = []
        self.running: asyncio.Event | None = None  # the process publishes only while set (SIGSTOP)

    async def connect(self) -> None:
        self.broker._attach(self)
        self._open = True

    def _drop(self) -> None:
        """The network side of a cut: subscriptions end, the broker forgets the connection."""
        if not self._open:
            return
        self._open = False
        self.broker._detach(self)
        for sub in self._subs:
            sub.end()
        self._subs.clear()

    async def close(self) -> None:
        self._drop()

    async def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> None:
        if self.running is not None:
            await self.running.wait()
        if not self._open:
            raise TransportError(f"{self.client_id}: publish on a lost connection")
        self.broker._publish(self.client_id, topic, check_publish(topic, payload), retain)
        await asyncio.sleep(0)  # the PUBACK comes back: let subscribers run first

    def ack(self, message: Message) -> None:
        """Acknowledge a message of a durable filter (after it was spooled)."""
        if self._open:
            self.broker._ack(self, message)

    def subscribe(self, topic_filter: str) -> AbstractAsyncContextManager[Subscription]:
        return self._subscription(topic_filter)

    @asynccontextmanager
    async def _subscription(self, topic_filter: str) -> AsyncIterator[Subscription]:
        if not self._open:
            raise TransportError(f"{self.client_id}: subscribe on a lost connection")
        sub = Subscription(topic_filter)
        self._subs.append(sub)
        self.broker._subscribe(self, sub)
        try:
            yield sub
        finally:
            if sub in self._subs:
                self.broker._unsubscribe(self, sub)
                self._subs.remove(sub)
