"""What Locust's workers run: each Locust user is one MQTT connection (paho-mqtt, gevent
friendly) carrying many logical clients, round after round.

For each announced round the user builds its clients' reports here, in the worker (k-RR, the
HPKE onion, the credential: the `encrypt` stage) and sends them at their planned arrival times.
A good report asks for mix 0's signed receipt on the connection's own reply topic (its MQTT
client id); the user checks each receipt (`Outstanding`: mix 0's signature for the round, the
report's digest, the client's tag) and resends a report without one (the same bytes) until it
comes or the round is over. At most `window` reports of a connection await their receipt (or,
for reports that get none, their PUBACK): flow control. Each report is two Locust request
events: until its receipt (`report (receipt)`, the main series; a failure if none came) and
until the broker's PUBACK (`report (PUBACK)`), so Locust's statistics, CSV files, web UI and
master/worker mode work as for any Locust test. Stragglers send after the round's announcement
is withdrawn (the round is over). Each user writes its measurements to `out_dir/users/` when
it is done.

Run by `shufflekit loadtest` (`locust -f` this file, settings in $SHUFFLEKIT_LOADTEST_PLAN);
across machines see deploy/loadtest.md.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import gevent
import numpy as np
import paho.mqtt.client as mqtt
from gevent.event import Event
from gevent.lock import Semaphore
from gevent.queue import Queue
from locust import User, runners, task
from locust.runners import WorkerRunner
from paho.mqtt.enums import CallbackAPIVersion

from shufflekit.app.loadtest.outstanding import Outstanding, Sent
from shufflekit.app.loadtest.plan import (
    BAD,
    BAD_KINDS,
    DROPOUT,
    STRAGGLER,
    LoadSettings,
    clients_of,
    connection_id,
    round_plan,
)
from shufflekit.app.loadtest.wire_client import CoalescingClient
from shufflekit.app.services.clients import malformed
from shufflekit.client.agent import build_onion, wrap_envelope
from shufflekit.core.credentials import ClientCredential, EnrollmentKey
from shufflekit.core.messages import Announcement
from shufflekit.core.receipts import receipt_topic
from shufflekit.core.topics import Topics

RECEIPT_NAME = "report (receipt)"  # Locust's series: latency until mix 0's receipt
PUBACK_NAME = "report (PUBACK)"  # and until the broker's acknowledgement
# seconds of building reports between yields: the MQTT loop then writes what was built in
# one go, and delays a PUBACK or a receipt by little more than that
YIELD_AFTER = 0.002
GRACE = 3.0  # seconds after a round's result (or the withdrawal of its announcement) that
# reports still without a receipt are given up: mix 0 sends receipts before it closes
log = logging.getLogger("shufflekit.loadtest")
runners.WORKER_REPORT_INTERVAL = 1.0  # workers send their statistics to the master every second
# Building onions is CPU work: on a loaded machine a worker may answer heartbeats late. The
# master (which imports this file too) must not take it for gone and stop the test.
runners.HEARTBEAT_LIVENESS = 60
_local_slots = itertools.count()


class ShufflekitUser(User):
    """One MQTT connection carrying every `connections`-th logical client."""

    def on_start(self) -> None:
        """Connect, subscribe to announcements, results and its receipts, say it is ready."""
        self.s = LoadSettings.from_env()
        runner = self.environment.runner
        worker = runner.worker_index if isinstance(runner, WorkerRunner) else 0
        per_worker = int(os.environ.get("SHUFFLEKIT_LOADTEST_PER_WORKER", self.s.connections))
        self.slot = worker * per_worker + next(_local_slots)
        self.clients = clients_of(self.s, self.slot)
        self.topics = Topics(self.s.deployment)
        # the MQTT client id, and the reply id mix 0 sends this connection's receipts to
        self.reply = connection_id(self.slot)
        self.receipts_at = receipt_topic(self.s.deployment, self.reply)
        self.enrol = (
            EnrollmentKey.from_private_b64(self.s.enrollment_key) if self.s.enrollment_key else None
        )
        self.creds: dict[int, ClientCredential] = {}
        self.announcements: Queue[tuple[Announcement, float]] = Queue()
        self.withdrawn: dict[str, float] = {}  # round id -> when its announcement went away
        self.deadlines: dict[str, float] = {}
        self.results: dict[str, dict[str, Any]] = {}
        self.current: str | None = None
        self.seen: set[str] = set()
        self.window = Semaphore(self.s.window)
        self.outstanding = Outstanding()
        self.inbound: Queue[bytes] = Queue()  # receipt batches, checked in their own greenlet
        # mid -> (sent at, round, timely good, late, first send, holds the window until PUBACK)
        self.sent_at: dict[int, tuple[float, str, bool, bool, bool, bool]] = {}
        self.early: dict[int, float] = {}
        self.stats: dict[str, dict[str, Any]] = {}
        self.connected = Event()
        self.connects = 0
        self.disconnects = 0
        self.client = self._connect()
        self.out = Path(self.s.out_dir)
        self.phase = "waiting for round 1"
        gevent.spawn(self._progress)
        gevent.spawn(self._receipts)
        gevent.spawn(self._resender)
        (self.out / "ready").mkdir(parents=True, exist_ok=True)
        (self.out / "ready" / f"{self.slot}").write_text("ready")

    def _progress(self) -> None:
        """Every second: what this connection did so far (the harness shows the sums)."""
        folder = self.out / "progress"
        folder.mkdir(parents=True, exist_ok=True)
        while True:
            state = {
                "phase": self.phase,
                "sent": sum(st["sent"] for st in self.stats.values()),
                "acked": sum(st["acked"] for st in self.stats.values()),
                "receipted": sum(st["receipted"] for st in self.stats.values()),
                "pending": len(self.outstanding.sent),
                "rounds_seen": len(self.seen),
                "disconnects": self.disconnects,
            }
            tmp = folder / f".{self.slot}.tmp"
            tmp.write_text(json.dumps(state))
            tmp.rename(folder / f"{self.slot}.json")
            gevent.sleep(1.0)

    def _connect(self) -> mqtt.Client:
        c = CoalescingClient(
            CallbackAPIVersion.VERSION2, client_id=self.reply, protocol=mqtt.MQTTv5
        )
        if self.s.username:
            c.username_pw_set(self.s.username, self.s.password)
        if self.s.tls:
            c.tls_set(ca_certs=self.s.ca_file)
        c.max_inflight_messages_set(self.s.in_flight)
        c.max_queued_messages_set(0)
        c.on_connect = self._on_connect
        c.on_message = self._on_message
        c.on_publish = self._on_publish
        c.on_disconnect = self._on_disconnect
        c.enable_logger(log)
        c.connect(self.s.host, self.s.port, keepalive=120)
        c.loop_start()
        if not self.connected.wait(30):
            raise RuntimeError(f"no MQTT connection to {self.s.host}:{self.s.port} in 30 s")
        return c

    def _on_connect(self, c: mqtt.Client, _u: Any, _f: Any, rc: Any, _p: Any = None) -> None:
        if rc.is_failure:
            return
        c.subscribe(self.receipts_at, qos=1)
        c.subscribe(self.topics.announce, qos=1)
        c.subscribe(f"{self.topics.prefix}/round/+/result", qos=1)
        self.connects += 1
        if self.connects > 1:  # receipts sent to the lost connection are gone: resend now
            for sent in self.outstanding.resend_all(time.time()):
                self._publish(sent.round_id, sent.payload, (False, False, False, False))
        self.connected.set()

    def _on_disconnect(self, _c: mqtt.Client, _u: Any, _f: Any, rc: Any, _p: Any = None) -> None:
        self.disconnects += 1
        log.warning("connection %d lost (%s); paho reconnects", self.slot, rc)

    def _on_message(self, _c: mqtt.Client, _u: Any, msg: mqtt.MQTTMessage) -> None:
        now = time.time()
        if msg.topic == self.receipts_at:
            self.inbound.put(bytes(msg.payload))
            return
        if msg.topic == self.topics.announce:
            if not msg.payload:
                if self.current is not None:
                    self.withdrawn.setdefault(self.current, now)
                return
            ann = Announcement.from_bytes(bytes(msg.payload))
            if isinstance(ann, Announcement) and ann.round_id not in self.seen:
                if self.current is not None:
                    self.withdrawn.setdefault(self.current, now)
                self.seen.add(ann.round_id)
                self.current = ann.round_id
                self.deadlines[ann.round_id] = ann.deadline
                self.outstanding.round(ann)
                self.announcements.put((ann, now))
            return
        rid = msg.topic.split("/")[-2]
        with_batch = json.loads(msg.payload) if msg.payload else {}
        self.results.setdefault(rid, {"t": now, "batch_size": with_batch.get("batch_size")})
        self.withdrawn.setdefault(rid, now)

    def _on_publish(self, _c: mqtt.Client, _u: Any, mid: int, _rc: Any, _p: Any) -> None:
        now = time.time()
        entry = self.sent_at.pop(mid, None)
        if entry is None:
            self.early[mid] = now
            return
        self._acked(entry, now)

    def _acked(self, entry: tuple[float, str, bool, bool, bool, bool], now: float) -> None:
        """The broker's PUBACK: counted and reported for a first send (not for resends)."""
        t0, rid, timely_good, late, first, holds = entry
        if holds:
            self.window.release()
        if not first:
            return
        st = self.stats[rid]
        st["acked"] += 1
        st["acked_good"] += int(timely_good)
        st["puback_ms"].append((now - t0) * 1000)
        if not late:
            st["last_ack"] = max(st["last_ack"], now)
        self._event(PUBACK_NAME, now - t0, st["size"])

    def _event(self, name: str, seconds: float, size: int, exc: Exception | None = None) -> None:
        self.environment.events.request.fire(
            request_type="MQTT",
            name=name,
            response_time=seconds * 1000,
            response_length=size,
            exception=exc,
            context={},
        )

    def _receipts(self) -> None:
        """Check every receipt batch that arrives; a receipted report frees its window slot."""
        while True:
            payload = self.inbound.get()
            now = time.time()
            for sent in self.outstanding.receive(payload, now):
                st = self.stats[sent.round_id]
                st["receipted"] += 1
                if sent.timely_good:
                    st["receipt_ms"].append((now - sent.first) * 1000)
                    st["last_receipt"] = max(st["last_receipt"], now)
                    self._event(RECEIPT_NAME, now - sent.first, st["size"])
                self.window.release()
            gevent.sleep(0)

    def _resender(self) -> None:
        """Resend what is due (same bytes); give up the reports of rounds that are over."""
        while True:
            gevent.sleep(0.5)
            now = time.time()
            for sent in self.outstanding.due(now):
                self.stats[sent.round_id]["resent"] += 1
                self._publish(sent.round_id, sent.payload, (False, False, False, False))
            over = {r for r, t in self.withdrawn.items() if now > t + GRACE}
            over |= {r for r, d in self.deadlines.items() if now > d + GRACE}
            for sent in self.outstanding.give_up(over):
                st = self.stats[sent.round_id]
                if sent.timely_good:
                    st["unreceipted"] += 1
                    exc = RuntimeError("no receipt from mix 0 before the round was over")
                    self._event(RECEIPT_NAME, now - sent.first, st["size"], exc)
                self.window.release()

    def _payload(
        self, ann: Announcement, j: int, role: int, value: int, rng: Any
    ) -> tuple[bytes, str | None]:
        """Client j's envelope, and for a good report that asks for a receipt its digest."""
        cid = f"lt-{j}"
        cred = None
        if self.enrol is not None:
            cred = self.creds.get(j)
            if cred is None:
                cred = self.creds[j] = self.enrol.issue(ann.deployment, cid)
        if role != BAD:
            onion = build_onion(value, ann)
            if ann.receipt_key is None:  # an older deployment: no receipts to wait for
                return wrap_envelope(cid, onion, ann, cred), None
            digest = hashlib.sha256(onion).hexdigest()
            return wrap_envelope(cid, onion, ann, cred, self.reply), digest
        kind = BAD_KINDS[j % len(BAD_KINDS)]
        if kind == "foreign":  # encrypted for and naming another round
            other = ann.model_copy(update={"round_id": f"{ann.round_id}-foreign"})
            onion = build_onion(value, other)
            return wrap_envelope(cid, onion, other if cred else ann, cred), None
        return malformed(cid, value, ann, kind, rng, cred), None

    def _publish(
        self, rid: str, payload: bytes, flags: tuple[bool, bool, bool, bool], now: float = 0.0
    ) -> None:
        """Publish (QoS 1); `flags`: timely good, late, first send, holds the window until
        its PUBACK (a report that awaits no receipt)."""
        info = self.client.publish(self.topics.data(rid, 0), payload, qos=1)
        entry = (now or time.time(), rid, *flags)
        acked = self.early.pop(info.mid, None)
        if acked is not None:
            self._acked(entry, acked)
        else:
            self.sent_at[info.mid] = entry

    def _send(
        self, ann: Announcement, j: int, payload: bytes, digest: str | None, good: bool, late: bool
    ) -> None:
        self.window.acquire()
        now = time.time()
        st = self.stats[ann.round_id]
        if not late:
            st["first_send"] = min(st["first_send"], now)
        st["size"] = len(payload)
        st["sent"] += 1
        timely_good = good and not late
        st["sent_good"] += int(timely_good)
        if digest is not None:
            self.outstanding.add(digest, Sent(ann.round_id, j, payload, now, timely_good))
        self._publish(ann.round_id, payload, (timely_good, late, True, digest is None), now)

    def _round(self, ann: Announcement, seen_at: float, r: int) -> None:
        plan = round_plan(self.s, r, ann.k)
        rng = np.random.default_rng([self.s.seed, r, self.slot])
        st = self.stats[ann.round_id] = {
            "round": r,
            "announced": seen_at,
            "receipts": ann.receipt_key is not None,
            "sent": 0,
            "sent_good": 0,
            "acked": 0,
            "acked_good": 0,
            "receipted": 0,
            "unreceipted": 0,
            "resent": 0,
            "late": 0,
            "encrypt_s": 0.0,
            "first_send": float("inf"),
            "last_ack": 0.0,
            "last_receipt": 0.0,
            "receipt_ms": [],
            "puback_ms": [],
            "size": 0,
        }
        self.phase = f"round {r + 1}: sending"
        mine = [j for j in self.clients if plan.role[j] != DROPOUT]
        mine.sort(key=lambda j: plan.offset[j])
        late: list[int] = []
        ran = time.perf_counter()  # since the last yield to the other greenlets
        for j in mine:
            if plan.role[j] == STRAGGLER:
                late.append(j)
                continue
            wait = seen_at + plan.offset[j] - time.time()
            if wait > 0:
                gevent.sleep(wait)
            t = time.perf_counter()
            role = int(plan.role[j])
            payload, digest = self._payload(ann, j, role, int(plan.value[j]), rng)
            st["encrypt_s"] += time.perf_counter() - t
            self._send(ann, j, payload, digest, role != BAD, False)
            if time.perf_counter() - ran > YIELD_AFTER:  # the MQTT loop, connections, heartbeats
                gevent.sleep(0)
                ran = time.perf_counter()
        if late:
            self.phase = f"round {r + 1}: stragglers wait for the close"
            while ann.round_id not in self.withdrawn:  # stragglers: after the round is over
                gevent.sleep(0.05)
            for j in late:
                payload, digest = self._payload(ann, j, 0, int(plan.value[j]), rng)
                self._send(ann, j, payload, digest, True, True)
                st["late"] += 1

    @task
    def rounds(self) -> None:
        """Answer `rounds` announcements, then write this user's measurements and idle."""
        for r in range(self.s.rounds):
            self.phase = f"waiting for round {r + 1}"
            ann, seen_at = self.announcements.get()
            self._round(ann, seen_at, r)
        self.phase = "done: last receipts, acknowledgements and result"
        end = time.time() + 120
        while (self.sent_at or self.outstanding.sent) and time.time() < end:
            gevent.sleep(0.05)
        last = list(self.stats)[-1]
        while last not in self.results and time.time() < end:  # the last round's result
            gevent.sleep(0.05)
        rounds = {
            rid: st | {"result": self.results.get(rid), "withdrawn": self.withdrawn.get(rid)}
            for rid, st in self.stats.items()
        }
        summary = {
            "slot": self.slot,
            "rounds": rounds,
            "receipts_refused": self.outstanding.refused,
            "receipts_repeated": self.outstanding.repeated,
        }
        folder = self.out / "users"
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{self.slot}.tmp"
        tmp.write_text(json.dumps(summary))
        tmp.rename(folder / f"{self.slot}.json")
        while True:
            gevent.sleep(3600)

    def on_stop(self) -> None:
        """Close the connection."""
        self.client.loop_stop()
        self.client.disconnect()
