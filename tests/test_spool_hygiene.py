"""The spool keeps its promises (issue 14): private files, credentials dropped once the output is
stored, finished rounds purged, a corrupted spool quarantined with one error line, and a full or
unwritable spool aborting (and refunding) the round whose input it could not keep."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import stat
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from shufflekit.accountant.ledger import Budget, Ledger
from shufflekit.app.local import LocalDeployment
from shufflekit.app.rounds import RoundParams
from shufflekit.base.clock import VirtualClock
from shufflekit.base.errors import SpoolError
from shufflekit.core import hop as hop_module
from shufflekit.core.messages import Announcement
from shufflekit.core.spool import FINISHED_TTL, Arrival, Inbox, Spool, classify_hop_input
from shufflekit.core.transport import MemoryBroker
from tests.pipeline_helpers import population


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def _ann(rid: str) -> Announcement:
    return Announcement(
        deployment="t",
        round_id=rid,
        k=2,
        eps0=1.0,
        n_min=1,
        deadline=1.0,
        mix_keys=["a2V5"],
        analyzer_key="a2V5",
    )


def test_a_new_spool_is_private(tmp_path: Path) -> None:
    path = tmp_path / "state" / "spool-mix0.db"
    spool = Spool(path)
    spool.add([Arrival("r1", "data", "k", b"x" * 100)])
    assert _mode(path.parent) == 0o700
    assert _mode(path) == 0o600
    assert _mode(path.with_name(path.name + "-wal")) == 0o600
    spool.close()


def test_an_existing_spool_is_tightened(tmp_path: Path) -> None:
    path = tmp_path / "spool.db"
    Spool(path).close()
    path.chmod(0o644)
    Spool(path).close()
    assert _mode(path) == 0o600


def test_a_corrupted_spool_is_quarantined_with_one_error_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "spool-mix0.db"
    junk = b"this is not a database, it was overwritten by mistake " * 100
    path.write_bytes(junk)
    with caplog.at_level(logging.ERROR, logger="shufflekit.spool"):
        spool = Spool(path, clock=VirtualClock(1_800_000_000.0))
    assert spool.quarantined == tmp_path / "spool-mix0.db.corrupt-1800000000"
    assert spool.quarantined.read_bytes() == junk  # kept for the operator, not deleted
    (rec,) = [r for r in caplog.records if r.levelno >= logging.ERROR]
    line = rec.getMessage()
    assert str(path) in line and str(spool.quarantined) in line and "\n" not in line
    assert spool.add([Arrival("r1", "data", "k", b"x")]) == 1  # a fresh, working spool
    spool.close()


def test_a_spool_that_cannot_be_opened_is_one_line(tmp_path: Path) -> None:
    folder = tmp_path / "a-folder"
    folder.mkdir()
    with pytest.raises(SpoolError) as err:
        Spool(folder)
    assert str(folder) in str(err.value) and "\n" not in str(err.value)


def test_a_second_process_on_one_spool_is_refused_in_one_line(tmp_path: Path) -> None:
    """Two instances of one role on one spool took each other's broker session over, twice a
    second, until the round hung: the second now refuses to start, naming the first."""
    path = tmp_path / "spool-mix0.db"
    held = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert held.stdout is not None and held.stdout.readline().strip() == "holding"
        with pytest.raises(SpoolError) as err:
            Spool(path)
        message = str(err.value)
        assert f"pid {held.pid}" in message and "already running" in message
        assert "\n" not in message
    finally:
        held.kill()
        held.wait()
    Spool(path).close()  # the OS let go of the lock with the process: a restart opens it
    spool = Spool(path)
    spool.close()
    Spool(path).close()  # and a closed spool lets the next one in


HOLD = """
import sys, time
from pathlib import Path
from shufflekit.core.spool import Spool
s = Spool(Path(sys.argv[1]))
print("holding", flush=True)
time.sleep(60)
"""


def test_input_and_credentials_are_dropped_once_the_output_is_stored(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s.db")
    spool.begin(_ann("r1"))
    spool.add([Arrival("r1", "data", f"k{i}", b"envelope with credential") for i in range(5)])
    spool.save_output("r1", [b"peeled"], {})
    assert spool.messages("r1", "data") == []
    assert spool.output("r1")[0] == [b"peeled"]
    spool.close()


def test_ending_one_round_keeps_the_input_of_the_others(tmp_path: Path) -> None:
    """A hop may hold input of several rounds: one still collecting (mix 0's receipted
    reports), one not begun yet (chunks that came before its announcement). Storing one
    round's output or finishing it drops that round's input only."""
    spool = Spool(tmp_path / "s.db")
    for rid in ("r1", "r2"):
        spool.begin(_ann(rid))
        spool.add([Arrival(rid, "data", f"k{i}", f"{rid}-{i}".encode()) for i in range(3)])
    spool.add([Arrival("r3", "data", "early", b"r3-early")])
    spool.save_output("r1", [b"peeled"], {})
    spool.finish("r1", None)
    assert [p for _, p in spool.messages("r2", "data")] == [b"r2-0", b"r2-1", b"r2-2"]
    assert [p for _, p in spool.messages("r3", "data")] == [b"r3-early"]
    assert spool.messages("r1", "data") == [] and spool.output("r1")[0] == []
    spool.close()


def test_finished_rounds_are_forgotten_after_a_week() -> None:
    clock = VirtualClock(1_800_000_000.0)
    spool = Spool(clock=clock)
    spool.begin(_ann("old"))
    spool.finish("old", None)
    assert spool.state("old") == "done"
    clock.advance(FINISHED_TTL + 1)
    spool.begin(_ann("new"))
    spool.finish("new", None)
    assert spool.state("old") is None and spool.state("new") == "done"


def test_a_full_spool_refuses_input_and_frees_it_when_the_round_ends(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s.db", max_bytes=128 * 1024)
    spool.begin(_ann("r1"))
    with pytest.raises(SpoolError, match="full"):
        spool.add([Arrival("r1", "data", f"k{i}", b"x" * 1000) for i in range(200)])
    assert spool.messages("r1", "data") == []  # nothing half-stored
    spool.add([Arrival("r1", "data", f"k{i}", b"x" * 1000) for i in range(20)])
    with pytest.raises(SpoolError):
        spool.add([Arrival("r1", "data", f"m{i}", b"x" * 1000) for i in range(100)])
    spool.finish("r1", None)  # the round's input goes: room for the next round
    spool.begin(_ann("r2"))
    assert spool.add([Arrival("r2", "data", f"k{i}", b"x" * 1000) for i in range(20)]) == 20
    spool.close()


async def test_a_full_spool_aborts_and_refunds_the_round(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mix 0 cannot keep every report of the round (its spool is full): the round is aborted
    at mix 0, nothing is forwarded, the lost reports are counted, the cost is refunded."""
    made: list[Spool] = []

    def small_spool(*, clock: Any) -> Spool:
        made.append(Spool(tmp_path / f"spool{len(made)}.db", clock=clock, max_bytes=96 * 1024))
        return made[-1]

    monkeypatch.setattr(hop_module, "Spool", small_spool)
    led = Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    led.init_budget(Budget("test", 10.0, 1e-6, n_min=10, cost_model="ldp"))
    broker = MemoryBroker()
    dep = LocalDeployment(lambda _n: broker.connect(), "test", led, 2)
    pop, _ = population(1500, k=4)
    rep = await dep.run_round(RoundParams(k=4, eps0=1.0, n_min=10), pop)
    assert not rep.released and rep.abort is not None and rep.abort.hop == 0, rep.abort
    assert "could not keep" in rep.abort.reason and "full" in rep.abort.reason
    assert rep.mixes[0].counters.rejected["spool_unwritable"] > 0, rep.mixes
    assert rep.mixes[0].forwarded == 0
    assert [r.status for r in led.status("test").rounds] == ["refunded"]
    for s in made:
        s.close()


def test_a_spool_that_cannot_write_says_so_once_a_round(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Mix 0 on a full disk logged the same error for every message that came after (1,858
    lines in an audit); it is now said once a round, and every lost message still counted."""

    class Full(Spool):
        def add(self, arrivals: Sequence[Arrival]) -> int:
            raise SpoolError("cannot store input: database or disk is full")

    inbox = Inbox(MemoryBroker().connect(), Full(), [], lambda _m: None)
    with caplog.at_level(logging.ERROR, logger="shufflekit.spool"):
        for i in range(50):
            inbox._store([Arrival(r, "data", f"k{i}", b"x") for r in ("r1", "r2")])
    assert [r.getMessage() for r in caplog.records] == [
        "cannot store input: database or disk is full; round(s) r1, r2 aborted"
    ]
    assert inbox.failed == {"r1": ("cannot store input: database or disk is full", 50)} | {
        "r2": ("cannot store input: database or disk is full", 50)
    }


async def test_input_is_acked_only_once_committed(tmp_path: Path) -> None:
    """The broker forgets a durable message once it is acked (PUBACK): acked before the spool's
    commit, a hop killed in between loses it for good, a receipted report among it. Every
    message an inbox acks was already in a committed batch (the mutation audit's surviving
    `ack` before `_store` passed every kill -9 test: its window is a few milliseconds)."""
    broker = MemoryBroker()
    acked: list[bytes] = []
    committed: list[bytes] = []

    class Recording(Spool):
        def add(self, arrivals: Sequence[Arrival]) -> int:
            assert not set(acked) & {a.payload for a in arrivals}, "acked before it was stored"
            stored = super().add(arrivals)
            committed.extend(a.payload for a in arrivals)
            return stored

    async with broker.connect() as conn, broker.connect() as sender:
        conn.ack = lambda m: acked.append(m.payload)  # type: ignore[attr-defined]
        topic = "shufflekit/t/round/r1/hop/0/data"
        inbox = Inbox(conn, Recording(tmp_path / "spool.db"), [topic], classify_hop_input)
        subscribed = asyncio.Event()
        running = asyncio.create_task(inbox.run(subscribed))
        await subscribed.wait()
        for i in range(20):
            await sender.publish(topic, bytes([i]) * 40)
            if i % 7 == 0:
                await asyncio.sleep(0)  # several batches
        for _ in range(500):  # (the inbox's task ends at once if `add` saw an acked message)
            if len(acked) >= 20 or running.done():
                break
            await asyncio.sleep(0.01)
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running  # raises the AssertionError of `add`, if any
    assert sorted(acked) == sorted(committed) and len(set(acked)) == 20
