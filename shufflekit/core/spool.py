"""A hop's durable inbox: every input message is written to SQLite before it is acknowledged.

A mix or the analyzer subscribes once (per connection) to its input topics for every round
(`Inbox`); each message is spooled, de-duplicated by a key, committed, and only then acked to
the broker (manual QoS 1 acks), so a service killed at any point loses nothing the broker
considers delivered and counts nothing twice. The round logic reads its input from the spool,
and records there where it is (the round's announcement, its frozen input, the permuted output
it is about to forward, its end), so a restarted service resumes each unfinished round from
exactly where the spool says it was. See "Durability" in deploy/README.md.

The spool is private (0600 in a 0700 folder it creates); a corrupted one is moved aside and a
fresh one started (one error line names the quarantined file); a spool that cannot be written
(disk full, `max_bytes` reached, read-only) fails the rounds whose input it could not keep,
which their hop then aborts: never a partial release.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shufflekit.base.clock import Clock, system_clock
from shufflekit.base.errors import (
    InternalError,
    InvalidReport,
    RoundAborted,
    SpoolError,
    TransportError,
)
from shufflekit.core.counters import RejectionCounter
from shufflekit.core.messages import Announcement, Close
from shufflekit.core.transport.base import Message, Subscription, Transport, drain
from shufflekit.core.waiting import within

CLOSE_KEY = "close"  # the key of a round's close marker: the first one freezes mix 0's input
UNKNOWN_ROUND_TTL = 86_400.0  # seconds: input for rounds this hop never served is dropped then
FINISHED_TTL = 7 * 86_400.0  # seconds a finished round is remembered (a repeated prepare)

log = logging.getLogger("shufflekit.spool")

_SCHEMA = """
create table if not exists inbox (
    seq integer primary key autoincrement,
    round_id text not null, kind text not null, key text not null,
    payload blob not null, at real not null,
    unique (round_id, kind, key));
-- a round's messages after a seq (mix 0 reads its new input as it arrives): a range seek,
-- not a scan of the whole round
create index if not exists inbox_round_seq on inbox (round_id, kind, seq);
create table if not exists duplicates (
    round_id text not null, kind text not null, n integer not null,
    primary key (round_id, kind));
create table if not exists rounds (
    round_id text primary key, announcement text not null, state text not null,
    outcome text, at real not null);
create table if not exists output (
    round_id text not null, idx integer not null, item blob not null,
    primary key (round_id, idx));
"""


@dataclass(frozen=True)
class Arrival:
    """One input message as the spool keeps it: round, kind (data, manifest, close), de-dup key."""

    round_id: str
    kind: str
    key: str
    payload: bytes
    # a repeat of it is a sender's resend (an envelope awaiting its receipt), not a replay:
    # counted as `resend` instead of `kind` in the duplicates table
    resend: bool = False


def digest_key(payload: bytes) -> str:
    """The default de-duplication key: SHA-256 of the message body."""
    return hashlib.sha256(payload).hexdigest()


class Spool:
    """SQLite spool of one service (`path`), or in memory (`None`: in-process deployments).

    `clock` stamps arrivals and rounds, and expires input of rounds this hop never served.
    `round_bytes` and `total_bytes` bound the input payload bytes kept for one round and for
    all rounds: a new arrival that would pass one is not kept, and is counted by reason in
    `refused` (`spool_round_full`, `spool_full`); mix 0 then never receipts it.
    `max_bytes` bounds the file itself: beyond it writes fail, as on a full disk.
    """

    def __init__(
        self,
        path: Path | None = None,
        *,
        clock: Clock = system_clock,
        max_bytes: int | None = None,
        round_bytes: int | None = None,
        total_bytes: int | None = None,
    ) -> None:
        self.clock = clock
        self.path = path
        self.round_bytes, self.total_bytes = round_bytes, total_bytes
        self.quarantined: Path | None = None  # where a corrupted spool was moved
        self._lock_fd = _lock(path) if path is not None else None
        try:
            self._db = self._open()
        except sqlite3.DatabaseError as exc:  # corrupt, truncated, or not SQLite at all
            if path is None or isinstance(exc, sqlite3.OperationalError):
                self._unlock()
                raise SpoolError(f"cannot open the spool {path}: {exc}") from None
            self.quarantined = _quarantine(path, self.clock.time())
            log.error(
                "spool %s cannot be read (%s); moved it to %s and started an empty spool "
                "(its unfinished rounds are aborted)",
                path,
                exc,
                self.quarantined,
            )
            self._db = self._open()
        if max_bytes is not None:  # a bound on the whole spool: beyond it, writes fail (full)
            page = int(self._db.execute("pragma page_size").fetchone()[0])
            self._db.execute(f"pragma max_page_count = {max(2, max_bytes // page)}")
        self._sizes: dict[str, int] = {}  # input payload bytes kept, by round
        self.refused: dict[str, RejectionCounter] = {}  # arrivals past a bound, by round
        self._count_sizes()

    def _count_sizes(self) -> None:
        """Recount the input payload bytes kept by round (after input was deleted)."""
        rows = self._db.execute(
            "select round_id, sum(length(payload)) from inbox group by round_id"
        ).fetchall()
        self._sizes = {str(r): int(n or 0) for r, n in rows}

    def _over(self, a: Arrival) -> str | None:
        """`spool_round_full` or `spool_full` if keeping `a` would pass `round_bytes` or
        `total_bytes`, else None."""
        n = len(a.payload)
        if self.round_bytes is not None and self._sizes.get(a.round_id, 0) + n > self.round_bytes:
            return "spool_round_full"
        if self.total_bytes is not None and sum(self._sizes.values()) + n > self.total_bytes:
            return "spool_full"
        return None

    def _kept(self, a: Arrival) -> bool:
        row = self._db.execute(
            "select 1 from inbox where round_id = ? and kind = ? and key = ?",
            (a.round_id, a.kind, a.key),
        ).fetchone()
        return row is not None

    def _open(self) -> sqlite3.Connection:
        """Connect, make the file private, check it is a sound SQLite file, create the tables."""
        if self.path is None:
            db = sqlite3.connect(":memory:")
        else:
            _private_file(self.path)
            db = sqlite3.connect(str(self.path))
        try:
            if self.path is not None:
                db.execute("pragma journal_mode=wal")
                db.execute("pragma synchronous=normal")  # a commit survives a killed process
                row = db.execute("pragma quick_check").fetchone()
                if row is None or row[0] != "ok":
                    raise sqlite3.DatabaseError(f"integrity check: {row[0] if row else '?'}")
            db.executescript(_SCHEMA)
            db.commit()
        except sqlite3.DatabaseError:
            db.close()
            raise
        return db

    def close(self) -> None:
        """Close the database and let another process have the spool."""
        self._db.close()
        self._unlock()

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    @contextlib.contextmanager
    def _writing(self, what: str) -> Iterator[sqlite3.Connection]:
        """One write transaction; SpoolError (one line) if the spool cannot be written."""
        try:
            with self._db:
                yield self._db
        except sqlite3.OperationalError as exc:
            raise SpoolError(f"spool {self.path or ':memory:'}: cannot {what}: {exc}") from None

    @contextlib.contextmanager
    def _recounting_on_failure(self) -> Iterator[None]:
        """A failed write was rolled back: the byte counts are taken again from the file."""
        try:
            yield
        except SpoolError:
            self._count_sizes()
            raise

    # ---------------------------------------------------------------- the inbox
    def add(self, arrivals: Sequence[Arrival]) -> int:
        """Spool `arrivals` in one transaction; those already spooled are counted as
        duplicates instead, those past a bound as `refused`. Returns how many were new;
        SpoolError if it cannot (none kept)."""
        new = 0
        now = self.clock.time()
        with self._recounting_on_failure(), self._writing("store input"):
            for a in arrivals:
                full = self._over(a)
                if full is not None and not self._kept(a):  # past a bound: refused, counted
                    refused = self.refused.setdefault(a.round_id, RejectionCounter())
                    if not refused.rejected[full]:  # said once a round, then counted
                        bound = "round_bytes" if full == "spool_round_full" else "total_bytes"
                        log.warning(
                            "round %s: the spool is full (spool_%s); refusing its further input",
                            a.round_id,
                            bound,
                        )
                    refused.reject(full)
                    continue
                cur = self._db.execute(
                    "insert or ignore into inbox (round_id, kind, key, payload, at) "
                    "values (?, ?, ?, ?, ?)",
                    (a.round_id, a.kind, a.key, a.payload, now),
                )
                if cur.rowcount:
                    new += 1
                    self._sizes[a.round_id] = self._sizes.get(a.round_id, 0) + len(a.payload)
                else:
                    self._db.execute(
                        "insert into duplicates values (?, ?, 1) on conflict (round_id, kind) "
                        "do update set n = n + 1",
                        (a.round_id, "resend" if a.resend else a.kind),
                    )
        return new

    def messages(
        self,
        round_id: str,
        kind: str,
        before: int | None = None,
        after: int = -1,
        limit: int = -1,
    ) -> list[tuple[int, bytes]]:
        """(seq, payload) of the round's spooled messages of `kind`, in arrival order: those
        after seq `after` and before seq `before`, at most `limit` (-1: all)."""
        rows = self._db.execute(
            "select seq, payload from inbox where round_id = ? and kind = ? and seq < ? "
            "and seq > ? order by seq limit ?",
            (round_id, kind, before if before is not None else 2**62, after, limit),
        ).fetchall()
        return [(int(s), bytes(p)) for s, p in rows]

    def count(self, round_id: str, kind: str, after: int = -1) -> int:
        """How many distinct messages of `kind` the round has spooled (after seq `after`)."""
        row = self._db.execute(
            "select count(*) from inbox where round_id = ? and kind = ? and seq > ?",
            (round_id, kind, after),
        ).fetchone()
        return int(row[0])

    def duplicates(self, round_id: str, kind: str) -> int:
        """How many deliveries of `kind` repeated a message already spooled."""
        row = self._db.execute(
            "select n from duplicates where round_id = ? and kind = ?", (round_id, kind)
        ).fetchone()
        return int(row[0]) if row else 0

    def close_seq(self, round_id: str) -> int | None:
        """Where the round's input was frozen (its close marker's seq), or None if still open."""
        row = self._db.execute(
            "select seq from inbox where round_id = ? and kind = 'close' and key = ?",
            (round_id, CLOSE_KEY),
        ).fetchone()
        return int(row[0]) if row else None

    def close_round(self, round_id: str) -> int:
        """Freeze the round's input now unless it already is; returns the close marker's seq."""
        self.add([Arrival(round_id, "close", CLOSE_KEY, b"")])
        seq = self.close_seq(round_id)
        if seq is None:
            raise InternalError(f"round {round_id}: no close marker right after spooling it")
        return seq

    # ---------------------------------------------------------------- rounds
    def begin(self, ann: Announcement) -> str:
        """Record that this hop serves the round (once); returns its state: open, output, done."""
        with self._writing("start the round"):
            self._db.execute(
                "insert or ignore into rounds values (?, ?, 'open', null, ?)",
                (ann.round_id, ann.model_dump_json(), self.clock.time()),
            )
        return self.state(ann.round_id) or "open"

    def state(self, round_id: str) -> str | None:
        """open (collecting), output (permuted output stored, forwarding), done; None: unknown."""
        row = self._db.execute(
            "select state from rounds where round_id = ?", (round_id,)
        ).fetchone()
        return str(row[0]) if row else None

    def announcement(self, round_id: str) -> Announcement | None:
        """The announcement of a round this hop began, or None."""
        row = self._db.execute(
            "select announcement from rounds where round_id = ?", (round_id,)
        ).fetchone()
        return Announcement.model_validate_json(row[0]) if row else None

    def unfinished(self) -> list[Announcement]:
        """Announcements of the rounds this hop started and did not finish (to resume)."""
        rows = self._db.execute(
            "select announcement from rounds where state != 'done' order by at"
        ).fetchall()
        return [Announcement.model_validate_json(r[0]) for r in rows]

    def save_output(self, round_id: str, items: Sequence[bytes], outcome: dict[str, Any]) -> None:
        """Store the permuted output (and what the round did) before any of it is forwarded,
        so a restart forwards the very same batch again instead of a new permutation. The
        round's input (client credentials included) is dropped in the same transaction: the
        output is all a resumed round needs."""
        with self._writing("store the output"):
            self._db.execute("delete from output where round_id = ?", (round_id,))
            self._db.execute("delete from inbox where round_id = ?", (round_id,))
            self._db.executemany(
                "insert into output values (?, ?, ?)",
                [(round_id, i, it) for i, it in enumerate(items)],
            )
            self._db.execute(
                "update rounds set state = 'output', outcome = ? where round_id = ?",
                (json.dumps(outcome), round_id),
            )
        self._sizes.pop(round_id, None)

    def output(self, round_id: str) -> tuple[list[bytes], dict[str, Any]]:
        """The stored output batch and outcome of a round in state `output`."""
        rows = self._db.execute(
            "select item from output where round_id = ? order by idx", (round_id,)
        ).fetchall()
        return [bytes(r[0]) for r in rows], self.outcome(round_id) or {}

    def outcome(self, round_id: str) -> dict[str, Any] | None:
        """The stored outcome of the round, if any."""
        row = self._db.execute(
            "select outcome from rounds where round_id = ?", (round_id,)
        ).fetchone()
        return json.loads(row[0]) if row and row[0] else None

    def finish(self, round_id: str, outcome: dict[str, Any] | None) -> None:
        """The round is over here: keep its outcome (for a week), drop its input and output,
        and drop input of rounds this hop never served that is older than a day."""
        self.refused.pop(round_id, None)
        with self._writing("finish the round"):
            self._db.execute(
                "update rounds set state = 'done', outcome = ? where round_id = ?",
                (json.dumps(outcome) if outcome is not None else None, round_id),
            )
            self._db.execute("delete from inbox where round_id = ?", (round_id,))
            self._db.execute("delete from output where round_id = ?", (round_id,))
            self._db.execute(
                "delete from inbox where at < ? and round_id not in (select round_id from rounds)",
                (self.clock.time() - UNKNOWN_ROUND_TTL,),
            )
            self._db.execute(
                "delete from rounds where state = 'done' and at < ?",
                (self.clock.time() - FINISHED_TTL,),
            )
        self._count_sizes()


def _lock(path: Path) -> int:
    """Hold `path`.lock (flock, released by the OS when the process dies): two processes of
    one role on one spool would take each other's broker session over and share its rounds."""
    lock = path.with_name(path.name + ".lock")
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(lock, os.O_CREAT | os.O_RDWR, 0o600)
    except OSError as exc:
        raise SpoolError(f"cannot create the spool's lock {lock}: {exc.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise SpoolError(
            f"the spool {path} is in use by another process (pid {holder}): is this role "
            "already running?"
        ) from None
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    return fd


def _private_file(path: Path) -> None:
    """Create `path`'s folder (0700) and the file itself (0600) unless they exist; tighten the
    file (and SQLite's WAL and shared-memory files, which take its mode) if they do."""
    try:
        if not path.parent.exists():
            path.parent.mkdir(mode=0o700, parents=True)
        elif path.parent.stat().st_mode & 0o077:
            log.warning("spool folder %s is open to other users; chmod 700 it", path.parent)
        os.close(os.open(path, os.O_CREAT | os.O_RDWR, 0o600))
        for p in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
            if p.exists():
                p.chmod(0o600)
    except OSError as exc:
        raise SpoolError(f"cannot open the spool {path}: {exc.strerror}") from None


def _quarantine(path: Path, now: float) -> Path:
    """Move a corrupted spool (and its WAL and shared-memory files) aside; the new name."""
    dest = path.with_name(f"{path.name}.corrupt-{int(now)}")
    for suffix in ("", "-wal", "-shm"):
        src = path.with_name(path.name + suffix)
        if src.exists():
            src.rename(dest.with_name(dest.name + suffix))
    return dest


Classify = Callable[[Message], Arrival | None]


class Inbox:
    """Spools every message of `filters` and acks it after the commit; wakes up readers.

    `classify` turns a message into an Arrival (None: junk, acked and dropped). `after` is
    awaited with each batch of arrivals (maybe none) once it is committed and acked (mix 0
    sends receipts there). Run it with `run()` for the lifetime of a connection; readers wait
    for news with `changed()`, for at most a timeout measured on `clock`.
    """

    def __init__(
        self,
        transport: Transport,
        spool: Spool,
        filters: Sequence[str],
        classify: Classify,
        *,
        clock: Clock = system_clock,
        after: Callable[[list[Arrival]], Awaitable[None]] | None = None,
    ) -> None:
        self.clock = clock
        self.after = after
        self.transport = transport
        self.spool = spool
        self.filters = list(filters)
        self.classify = classify
        self.version = 0
        self.lost: str | None = None
        # rounds whose input the spool could not keep (disk full, unwritable): why, how many
        self.failed: dict[str, tuple[str, int]] = {}
        self._cond = asyncio.Condition()

    async def run(self, subscribed: asyncio.Event | None = None) -> None:
        """Subscribe to every filter and spool what arrives until the connection ends
        (TransportError) or this is cancelled."""
        async with contextlib.AsyncExitStack() as stack:
            subs = [
                await stack.enter_async_context(self.transport.subscribe(f)) for f in self.filters
            ]
            if subscribed is not None:
                subscribed.set()
            try:
                await asyncio.gather(*(self._consume(s, subs) for s in subs))
            except TransportError as exc:
                await self._notify(str(exc))
                raise

    async def _consume(self, sub: Subscription, subs: list[Subscription]) -> None:
        """Wake up on `sub`, then spool everything waiting on every filter, in filter order
        (a close is spooled after the data delivered before it), in one transaction."""
        ack: Callable[[Message], None] | None = getattr(self.transport, "ack", None)
        while True:
            first = await sub.get()
            msgs: list[Message] = []
            for s in subs:
                msgs += [first, *drain(s)] if s is sub else drain(s)
            arrivals = [a for m in msgs if (a := self.classify(m)) is not None]
            if arrivals:
                self._store(arrivals)  # committed before any of them is acked
            if ack is not None:
                for m in msgs:
                    ack(m)
            if self.after is not None:  # also without arrivals: mix 0 may owe receipts
                await self.after(arrivals)
            await self._notify(None)

    def _store(self, arrivals: list[Arrival]) -> None:
        """Spool `arrivals`; if the spool cannot keep them, their rounds fail (see `check`):
        what was lost cannot be counted, so those rounds must not be released."""
        try:
            self.spool.add(arrivals)
        except SpoolError as exc:
            new = sorted({a.round_id for a in arrivals} - set(self.failed))
            for a in arrivals:
                self.fail(a.round_id, str(exc), 1)
            if new:  # said once a round: a full disk fails every message after (counted)
                log.error("%s; round(s) %s aborted", exc, ", ".join(new))

    def fail(self, round_id: str, reason: str, lost: int = 0) -> None:
        """Record that `lost` input messages of `round_id` could not be kept, and why."""
        first, n = self.failed.get(round_id, (reason, 0))
        self.failed[round_id] = (first, n + lost)

    def check(self, round_id: str) -> None:
        """RoundAborted if input of `round_id` could not be spooled (it is not complete)."""
        if round_id in self.failed:
            reason, n = self.failed[round_id]
            raise RoundAborted(f"the spool could not keep {n} input message(s): {reason}")

    def count_lost(self, round_id: str, counters: RejectionCounter) -> None:
        """Count the round's input messages the spool could not keep as `spool_unwritable`."""
        if self.failed.get(round_id, ("", 0))[1]:
            counters.rejected["spool_unwritable"] += self.failed[round_id][1]

    async def _notify(self, lost: str | None) -> None:
        async with self._cond:
            self.version += 1
            if lost is not None:
                self.lost = lost
            self._cond.notify_all()

    async def changed(self, seen: int, timeout: float | None) -> int:
        """Wait until something was spooled after version `seen` (or `timeout` passes);
        returns the new version. TransportError once the connection is lost."""
        async with self._cond:
            with contextlib.suppress(TimeoutError):
                await within(
                    self._cond.wait_for(lambda: self.version != seen or self.lost is not None),
                    timeout,
                    self.clock,
                )
            if self.lost is not None:
                raise TransportError(f"input connection lost: {self.lost}")
            return self.version


def hop_filters(deployment: str, hop: int, *, close: bool) -> list[str]:
    """The input topics of hop `hop` for every round (what its inbox subscribes to): data and
    manifest, plus (mix 0) the coordinator's close."""
    base = f"shufflekit/{deployment}/round/+"
    filters = [f"{base}/hop/{hop}/data", f"{base}/hop/{hop}/manifest"]
    return [*filters, f"{base}/close"] if close else filters


def classify_hop_input(msg: Message) -> Arrival | None:
    """An input message as the spool keys it: data and manifest by the SHA-256 of their bytes
    (a redelivery or a resent identical chunk is the same key), a valid close by CLOSE_KEY."""
    parts = msg.topic.split("/")
    if len(parts) < 5 or parts[2] != "round":
        return None
    round_id, kind = parts[3], parts[-1]
    if kind in ("data", "manifest"):
        return Arrival(round_id, kind, digest_key(msg.payload), msg.payload)
    if kind == "close":
        with contextlib.suppress(InvalidReport):
            c = Close.from_bytes(msg.payload)
            if isinstance(c, Close) and c.round_id == round_id:
                return Arrival(round_id, "close", CLOSE_KEY, b"")
    return None


@contextlib.asynccontextmanager
async def running_inbox(inbox: Inbox | None, make: Callable[[], Inbox]) -> AsyncIterator[Inbox]:
    """`inbox` if a service already runs one, else `make()` running (and subscribed) for the
    duration of the block: a hop used for a single round (tests, `LocalDeployment`)."""
    if inbox is not None:
        yield inbox
        return
    own = make()
    subscribed = asyncio.Event()
    task = asyncio.create_task(own.run(subscribed))
    try:
        waiter = asyncio.create_task(subscribed.wait())
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if task.done():
            task.result()
        yield own
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, TransportError):
            await task  # a connection lost meanwhile is the caller's to handle, not ours
