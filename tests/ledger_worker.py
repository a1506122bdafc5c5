"""A ledger client run as a separate OS process by the race and kill tests.

python -m tests.ledger_worker race URL WORKER REPS BARRIER_DIR PREFIX EPS0 BATCH
python -m tests.ledger_worker steps URL
python -m tests.ledger_worker churn URL
python -m tests.ledger_worker migrate URL legacy|current
"""

from __future__ import annotations

import sqlite3
import sys
import time
from pathlib import Path

from sqlalchemy.engine import Connection

from shufflekit.accountant import ledger_schema
from shufflekit.accountant.ledger import Ledger
from shufflekit.base.errors import BudgetExceeded


def _wait_for(path: Path, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {path}")
        time.sleep(0.001)


def race(
    url: str, worker: str, reps: int, barrier: Path, prefix: str, eps0: float, batch: int
) -> None:
    """In each repetition: reserve k=4 rounds of `eps0` until refused, then commit them."""
    led = Ledger(url, create=False)
    for rep in range(reps):
        _wait_for(barrier / f"go{rep}")
        mine: list[str] = []
        while True:
            rid = f"w{worker}-{len(mine)}"
            try:
                led.reserve(f"{prefix}{rep}", rid, k=4, eps0=eps0, actor=f"worker{worker}")
            except BudgetExceeded:
                break
            mine.append(rid)
        for rid in mine:
            led.commit(f"{prefix}{rep}", rid, batch_size=batch, actor=f"worker{worker}")
        # written under another name, then renamed: the test globs for done files and reads
        # them at once, and must never see one created but not yet written
        part = barrier / f"part{rep}-{worker}"
        part.write_text(str(len(mine)))
        part.replace(barrier / f"done{rep}-{worker}")


def steps(url: str) -> None:
    """A fixed sequence of ledger steps, announcing each one as it completes and then waiting
    for a line on stdin before the next, so that a kill lands exactly after the step the test
    waits for (without the wait, a loaded machine let the next step slip in first)."""
    led = Ledger(url)
    for name, step in [
        ("reserved-r1", lambda: led.reserve("kill", "r1", 4, 1.0)),
        ("committed-r1", lambda: led.commit("kill", "r1", 100)),
        ("reserved-r2", lambda: led.reserve("kill", "r2", 4, 1.0)),
        ("refunded-r2", lambda: led.refund("kill", "r2")),
        ("reserved-r3", lambda: led.reserve("kill", "r3", 4, 1.0)),
    ]:
        step()
        print(name, flush=True)
        if not sys.stdin.readline():  # EOF: the test is gone; stop here as if killed
            return
    time.sleep(60)  # wait to be killed


def churn(url: str) -> None:
    """Reserve, commit or refund rounds as fast as possible until killed."""
    led = Ledger(url)
    i = 0
    print("started", flush=True)
    while True:
        rid = f"c{i}"
        led.reserve("kill", rid, 4, 0.001)
        if i % 2:
            led.commit("kill", rid, 100)
        else:
            led.refund("kill", rid)
        i += 1


def migrate(url: str, how: str) -> None:
    """Bring a schema-1 ledger forward, announcing "migrating" from inside the migration (its
    write lock held) and going on once a line comes on stdin. `current`: this shufflekit's own
    open (which switches the file to WAL first); `legacy`: its first statement run on the file
    as it is (in its rollback journal, as an older tool or release left it), then rolled back."""

    def held() -> None:  # (the lock is the migration's transaction's: it stays held here)
        print("migrating", flush=True)
        sys.stdin.readline()

    if how == "current":
        first = ledger_schema.MIGRATIONS[1]

        def slow(conn: Connection) -> None:
            first(conn)
            held()

        ledger_schema.MIGRATIONS[1] = slow
        Ledger(url).close()
        return
    raw = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
    raw.execute("BEGIN IMMEDIATE")
    raw.execute("ALTER TABLE sk_budgets ADD COLUMN reservation_ttl FLOAT")
    held()
    raw.rollback()
    raw.close()


if __name__ == "__main__":
    cmd, url, *rest = sys.argv[1:]
    if cmd == "race":
        race(url, rest[0], int(rest[1]), Path(rest[2]), rest[3], float(rest[4]), int(rest[5]))
    elif cmd == "steps":
        steps(url)
    elif cmd == "churn":
        churn(url)
    elif cmd == "migrate":
        migrate(url, rest[0])
    else:
        raise SystemExit(f"unknown command {cmd}")
