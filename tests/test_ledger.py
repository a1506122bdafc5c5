"""The budget ledger: lifecycle, refusals, audit log, and clear errors that change nothing."""

from __future__ import annotations

import getpass
import math
import os
import re
import socket
import sqlite3
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import sqlalchemy as sa

from shufflekit.accountant.ledger import Budget, Ledger
from shufflekit.accountant.ledger_schema import budgets
from shufflekit.base.errors import (
    BudgetExceeded,
    InvalidParameters,
    LedgerError,
    LedgerNotFound,
    ScheduleViolation,
)
from tests.pipeline_helpers import ManualClock


def test_reserve_commit_refund_lifecycle(ledger: Ledger) -> None:
    ledger.reserve("test", "r1", k=4, eps0=2.0)
    ledger.reserve("test", "r2", k=4, eps0=3.0)
    st = ledger.status("test")
    assert (st.epsilon_spent, st.epsilon_spent_or_reserved) == (0.0, 5.0)
    ledger.commit("test", "r1", batch_size=100)
    ledger.commit("test", "r1", batch_size=100)  # idempotent
    ledger.refund("test", "r2", reason="aborted")
    st = ledger.status("test")
    assert (st.epsilon_spent, st.epsilon_spent_or_reserved, st.epsilon_remaining) == (2.0, 2.0, 8.0)
    assert [(r.round_id, r.status, r.batch_size) for r in st.rounds] == [
        ("r1", "committed", 100),
        ("r2", "refunded", None),
    ]
    with pytest.raises(LedgerError, match="never refunded"):
        ledger.refund("test", "r1")
    with pytest.raises(LedgerError, match="cannot be committed"):
        ledger.commit("test", "r2", 100)
    actions = [(h["action"], h["decision"]) for h in ledger.history("test")]
    assert actions == [
        ("init", "ok"),
        ("reserve", "ok"),
        ("reserve", "ok"),
        ("commit", "ok"),
        ("refund", "ok"),
        ("refund", "refused"),
    ]


def test_refusal_names_budget_and_what_is_left(ledger: Ledger) -> None:
    ledger.reserve("test", "r1", k=4, eps0=8.0)
    with pytest.raises(BudgetExceeded) as e:
        ledger.reserve("test", "r2", k=4, eps0=2.5)
    assert "'test'" in str(e.value) and "2 is left" in str(e.value)
    assert [r.round_id for r in ledger.status("test").rounds] == ["r1"]
    with pytest.raises(LedgerError, match="already recorded"):
        ledger.reserve("test", "r1", k=4, eps0=0.1)


def test_a_reserve_retried_after_its_reply_was_lost_changes_nothing(ledger: Ledger) -> None:
    """A service retries a ledger call whose connection broke; the first reserve may have
    landed. The same round and type again returns its record (the coordinator used to exit);
    another type, or a round already settled, is still refused."""
    first = ledger.reserve("test", "r1", k=4, eps0=2.0)
    again = ledger.reserve("test", "r1", k=4, eps0=2.0)
    assert again == first
    assert ledger.status("test").epsilon_spent_or_reserved == pytest.approx(2.0)
    assert [h["action"] for h in ledger.history("test")].count("reserve") == 1
    with pytest.raises(LedgerError, match="already recorded"):
        ledger.reserve("test", "r1", k=5, eps0=2.0)
    ledger.refund("test", "r1")
    with pytest.raises(LedgerError, match="already recorded"):
        ledger.reserve("test", "r1", k=4, eps0=2.0)


def test_per_round_cap(tmp_path: Path) -> None:
    led = Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    led.init_budget(Budget("d", 10.0, 1e-6, n_min=5, max_round_epsilon=1.0, cost_model="ldp"))
    with pytest.raises(BudgetExceeded, match="per-round cap"):
        led.reserve("d", "r1", k=3, eps0=1.5)


def test_commit_below_n_min_is_refused(ledger: Ledger) -> None:
    ledger.reserve("test", "r1", k=4, eps0=1.0)
    with pytest.raises(LedgerError, match="below n_min"):
        ledger.commit("test", "r1", batch_size=3)
    assert ledger.status("test").rounds[0].status == "reserved"


def test_missing_budget_and_bad_budgets(ledger: Ledger) -> None:
    with pytest.raises(LedgerError, match="has no budget"):
        ledger.reserve("nope", "r1", 4, 1.0)
    for b in (
        Budget("x", 0.0, 1e-6, 10, cost_model="ldp"),
        Budget("x", 1.0, 0.0, 10, cost_model="ldp"),
        Budget("x", 1.0, 1e-6, 10, max_corrupt=10, cost_model="ldp"),
        Budget("x", 1.0, 1e-6, 10, max_round_epsilon=0.0, cost_model="ldp"),
        Budget("x y", 1.0, 1e-6, 10, cost_model="ldp"),
        Budget("x" * 65, 1.0, 1e-6, 10, cost_model="ldp"),
        Budget("x", 1.0, 1e-6, 10, cost_model="nope"),
        # a delta of 1/n or more allows publishing one person's data (an outside audit:
        # 0.999999 made every 10,1 round cost epsilon 0, so the budget never ran out)
        Budget("x", 1.0, 0.999999, 10, cost_model="tight"),
        Budget("x", 1.0, 0.1, 10, cost_model="ldp"),
        Budget("x", 1.0, 0.2, 10, max_corrupt=5, cost_model="ldp"),
    ):
        with pytest.raises(InvalidParameters):
            ledger.init_budget(b)
        assert not ledger.has_budget(b.deployment)
    before = (ledger.budget("test"), ledger.history("test"))
    with pytest.raises(LedgerError, match=r"'test' already has a budget.*never overwritten"):
        ledger.init_budget(Budget("test", 1.0, 1e-6, 10, cost_model="ldp"))
    assert (ledger.budget("test"), ledger.history("test")) == before  # nothing changed


@pytest.mark.parametrize(("n_min", "max_corrupt"), [(50_000_000, 0), (10, 0), (3_000_000, 1_000)])
def test_a_delta_too_large_for_n_min_is_refused_with_a_delta_that_would_do(
    ledger: Ledger, n_min: int, max_corrupt: int
) -> None:
    """The refusal said "choose a delta well below it (1e-6, say)" also when 1e-6 was the
    delta it refused (`shufflekit demo --users 1e8` made n_min 5e7): the delta it suggests is
    one the same budget takes."""
    honest = n_min - max_corrupt
    budget = Budget("big", 1.0, 1.0 / honest, n_min, max_corrupt, cost_model="ldp")
    with pytest.raises(InvalidParameters) as err:
        ledger.init_budget(budget)
    said = re.search(r"well below it \(([0-9.e+-]+), say\)", str(err.value))
    assert said is not None, str(err.value)
    suggested = float(said.group(1))
    assert suggested * honest < 0.01, (suggested, honest)
    ledger.init_budget(Budget("big", 1.0, suggested, n_min, max_corrupt, cost_model="ldp"))


@pytest.mark.parametrize("ttl", [0.0, -1.0, math.nan, math.inf])
def test_reservation_ttl_must_be_positive(ledger: Ledger, ttl: float) -> None:
    with pytest.raises(
        InvalidParameters, match=r"reservation_ttl seconds \(or unset\) must be a finite number > 0"
    ):
        ledger.init_budget(Budget("ttl", 5.0, 1e-6, 10, reservation_ttl=ttl, cost_model="ldp"))
    assert not ledger.has_budget("ttl")


def test_history_of_an_unknown_deployment_is_an_error(ledger: Ledger) -> None:
    with pytest.raises(LedgerError, match="deployment 'nope' has no budget"):
        ledger.history("nope")
    for call in (lambda: ledger.status("nope"), lambda: ledger.refund("nope", "r1")):
        with pytest.raises(LedgerError, match="deployment 'nope' has no budget"):
            call()


def test_opening_a_missing_ledger_creates_nothing(ledger_url: str, tmp_path: Path) -> None:
    nested = tmp_path / "not" / "there" / "ledger.db"
    with pytest.raises(LedgerNotFound, match=r"no ledger at .*budget init"):
        Ledger(f"sqlite:///{nested}", create=False)
    assert not (tmp_path / "not").exists()
    with pytest.raises(LedgerNotFound):  # a missing file, or an empty PostgreSQL database
        Ledger(ledger_url, create=False)
    if ledger_url.startswith("sqlite"):
        assert list(tmp_path.iterdir()) == []
    else:
        engine = sa.create_engine(ledger_url)
        with engine.connect() as c:
            assert sa.inspect(c).get_table_names() == []
        engine.dispose()
    Ledger(ledger_url).init_budget(Budget("d", 1.0, 1e-6, 10, cost_model="ldp"))
    assert Ledger(ledger_url, create=False).budget("d").epsilon_total == 1.0


def test_foreign_corrupt_and_wrong_urls(tmp_path: Path) -> None:
    foreign = tmp_path / "foreign.db"
    c = sqlite3.connect(foreign)
    c.execute("create table customers (id int)")
    c.commit()
    c.close()
    before = foreign.read_bytes()
    for create in (True, False):
        with pytest.raises(LedgerError, match="foreign"):
            Ledger(f"sqlite:///{foreign}", create=create)
    # not a byte changed: the journal mode is still the file's own, and no -wal/-shm appeared
    assert foreign.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["foreign.db"]
    c = sqlite3.connect(foreign)
    assert c.execute("pragma journal_mode").fetchone() == ("delete",)
    c.close()
    corrupt = tmp_path / "corrupt.db"
    corrupt.write_bytes(b"this is not a database" * 100)
    before = corrupt.read_bytes()
    with pytest.raises(LedgerError, match="cannot open ledger"):
        Ledger(f"sqlite:///{corrupt}")
    assert corrupt.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corrupt.db", "foreign.db"]
    for url in ("not a url", "mysql://u@h/db"):
        with pytest.raises(LedgerError):
            Ledger(url)


@pytest.mark.parametrize("odd", ["{d}/l.db/", "{d}/l.db/.", "{d}/gone/../l.db"])
def test_every_command_opens_the_file_sqlite_opens(tmp_path: Path, odd: str) -> None:
    """SQLite opened `l.db/` (or `gone/../l.db`) as the file `l.db`, but the check that a
    ledger exists did not: `budget init` made a ledger that `status` then called missing, and
    on an existing one `init` said "see it with `status`", which said "create it with init"."""
    url = "sqlite:///" + odd.format(d=tmp_path)
    Ledger(url).init_budget(Budget("d", 1.0, 1e-6, 10))
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith("l.db-")] == ["l.db"]
    assert Ledger(url, create=False).budget("d").epsilon_total == 1.0
    assert Ledger(f"sqlite:///{tmp_path / 'l.db'}", create=False).has_budget("d")


def write_schema_1_ledger(db: Path) -> None:
    """A ledger as shufflekit's first schema wrote it: budget `old`, one committed 4,1.5 round."""
    with sqlite3.connect(db) as c:  # the schema-1 layout, as shipped
        c.executescript(
            """
            create table sk_schema_version (version integer not null);
            insert into sk_schema_version values (1);
            create table sk_budgets (deployment varchar(64) primary key, epsilon_total float,
              delta_total float, max_round_epsilon float, n_min integer, max_corrupt integer,
              created_at float);
            insert into sk_budgets values ('old', 5.0, 1e-6, null, 10, 0, 0);
            create table sk_rounds (deployment varchar(64), round_id varchar(64), status
              varchar(16), k integer, eps0 float, n_accounted integer, batch_size integer,
              epsilon_round float, created_at float, updated_at float,
              primary key (deployment, round_id));
            insert into sk_rounds values ('old', 'r1', 'committed', 4, 1.5, 10, 12, 1.5, 0, 0);
            create table sk_audit (id integer primary key autoincrement, at float,
              deployment varchar(64), round_id varchar(64), actor varchar(128),
              action varchar(32), decision varchar(16), detail text);
            """
        )


def test_schema_1_ledger_is_migrated_forward(tmp_path: Path) -> None:
    db = tmp_path / "v1.db"
    write_schema_1_ledger(db)
    led = Ledger(f"sqlite:///{db}")
    assert led.schema_found == 1
    assert led.status("old").epsilon_spent == 1.5
    # migrated to a planned budget with the types of the rounds it holds, the last one open
    b = led.budget("old")
    assert (b.mode, b.migrated_from, [str(e) for e in b.schedule]) == ("planned", 3, ["4,1.5"])
    with pytest.raises(ScheduleViolation, match=r"slot 2 of its schedule is 4,1\.5, not 4,1:"):
        led.reserve("old", "r2", 4, 1.0)
    led.reserve("old", "r2", 4, 1.5)  # the new columns work
    assert led.hold_role("old", "coordinator", "me", 15.0).holder == "me"  # and the new table
    with sqlite3.connect(db) as c:
        assert c.execute("select version from sk_schema_version").fetchall() == [(6,)]
    with sqlite3.connect(db) as c:
        c.execute("update sk_schema_version set version = 99")
    with pytest.raises(LedgerError, match="newer than this shufflekit"):
        Ledger(f"sqlite:///{db}")


_V2 = sa.MetaData()  # the schema-2 layout, as shipped: never edit
sa.Table("sk_schema_version", _V2, sa.Column("version", sa.Integer, nullable=False))
sa.Table(
    "sk_budgets",
    _V2,
    sa.Column("deployment", sa.String(64), primary_key=True),
    sa.Column("epsilon_total", sa.Float, nullable=False),
    sa.Column("delta_total", sa.Float, nullable=False),
    sa.Column("max_round_epsilon", sa.Float, nullable=True),
    sa.Column("n_min", sa.Integer, nullable=False),
    sa.Column("max_corrupt", sa.Integer, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("reservation_ttl", sa.Float, nullable=True),
    sa.Column("cost_model", sa.String(32), nullable=False, server_default="ldp"),
)
sa.Table(
    "sk_rounds",
    _V2,
    sa.Column("deployment", sa.String(64), primary_key=True),
    sa.Column("round_id", sa.String(64), primary_key=True),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("k", sa.Integer, nullable=False),
    sa.Column("eps0", sa.Float, nullable=False),
    sa.Column("n_accounted", sa.Integer, nullable=False),
    sa.Column("batch_size", sa.Integer, nullable=True),
    sa.Column("epsilon_round", sa.Float, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("updated_at", sa.Float, nullable=False),
    sa.Column("expires_at", sa.Float, nullable=True),
)
sa.Table(
    "sk_audit",
    _V2,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("at", sa.Float, nullable=False),
    sa.Column("deployment", sa.String(64), nullable=False),
    sa.Column("round_id", sa.String(64), nullable=True),
    sa.Column("actor", sa.String(128), nullable=False),
    sa.Column("action", sa.String(32), nullable=False),
    sa.Column("decision", sa.String(16), nullable=False),
    sa.Column("detail", sa.Text, nullable=False),
)


def test_schema_2_ledger_is_migrated_forward_and_keeps_its_rows(ledger_url: str) -> None:
    engine = sa.create_engine(ledger_url)
    t = _V2.tables
    with engine.begin() as c:
        _V2.create_all(c)
        c.execute(t["sk_schema_version"].insert().values(version=2))
        c.execute(
            t["sk_budgets"]
            .insert()
            .values(
                deployment="old",
                epsilon_total=5.0,
                delta_total=1e-6,
                n_min=10,
                max_corrupt=0,
                created_at=1.0,
                cost_model="ldp",
            )
        )
        row = {"deployment": "old", "k": 4, "eps0": 1.5, "n_accounted": 10, "created_at": 2.0}
        c.execute(
            t["sk_rounds"]
            .insert()
            .values(
                **row,
                round_id="r1",
                status="committed",
                batch_size=12,
                epsilon_round=1.5,
                updated_at=3.0,
            )
        )
        for at, rid, actor, action in [
            (1.0, None, "operator", "init"),
            (2.0, "r1", "coordinator", "reserve"),
            (3.0, "r1", "analyzer", "commit"),
        ]:
            c.execute(
                t["sk_audit"]
                .insert()
                .values(
                    at=at,
                    deployment="old",
                    round_id=rid,
                    actor=actor,
                    action=action,
                    decision="ok",
                    detail="{}",
                )
            )
    engine.dispose()
    led = Ledger(ledger_url)
    with led.engine.connect() as c:
        assert c.execute(sa.text("select version from sk_schema_version")).all() == [(6,)]
    assert led.status("old").epsilon_spent == 1.5
    assert led.lease_of("old", "coordinator") is None
    old = [(h["at"], h["who"], h["action"], h["principal"]) for h in led.history("old")]
    assert old == [
        (1.0, "operator", "init", None),
        (2.0, "coordinator", "reserve", None),
        (3.0, "analyzer", "commit", None),
    ]
    led.reserve("old", "r2", 4, 1.5)  # the migrated schedule: the type it held
    assert led.history("old")[-1]["principal"] == _me()
    assert len(led.history("old")) == 4


def _me() -> str:
    return f"{getpass.getuser()}@{socket.gethostname()}:{os.getpid()}"


def test_audit_names_role_user_host_and_pid(ledger: Ledger) -> None:
    ledger.reserve("test", "r1", 4, 1.0, actor="coordinator")
    last = ledger.history("test")[-1]
    assert (last["actor"], last["principal"]) == ("coordinator", _me())
    assert last["who"] == f"coordinator {_me()}"


def test_concurrent_init_on_postgres_is_a_clear_error(pg_url: str) -> None:
    """Two inits at once: the loser's row lock sees nothing and it hits the primary key."""
    first, second = Ledger(pg_url), Ledger(pg_url)
    errors: list[BaseException] = []

    def init_second() -> None:
        try:
            second.init_budget(Budget("dup", 2.0, 1e-6, 10, cost_model="ldp"))
        except BaseException as exc:
            errors.append(exc)

    with first.engine.connect() as c:
        tx = c.begin()
        c.execute(
            budgets.insert().values(
                deployment="dup",
                epsilon_total=1.0,
                delta_total=1e-6,
                n_min=10,
                max_corrupt=0,
                created_at=time.time(),
                cost_model="ldp",
            )
        )
        worker = threading.Thread(target=init_second)
        worker.start()
        deadline = time.monotonic() + 20
        with first.engine.connect() as watch:  # wait until its INSERT waits for our row
            while (
                watch.execute(
                    sa.text("select count(*) from pg_locks where not granted")
                ).scalar_one()
                == 0
            ):
                assert time.monotonic() < deadline and worker.is_alive()
                time.sleep(0.02)
        tx.commit()
    worker.join(20)
    assert len(errors) == 1 and isinstance(errors[0], LedgerError), errors
    assert "'dup' already has a budget" in str(errors[0])
    assert second.budget("dup").epsilon_total == 1.0  # the first one stands, unchanged


def test_expired_reservation_stops_counting_and_cannot_be_committed(ledger_url: str) -> None:
    led = Ledger(ledger_url)
    led.init_budget(Budget("ttl", 2.0, 1e-6, n_min=10, reservation_ttl=0.2, cost_model="ldp"))
    led.reserve("ttl", "r1", 4, 2.0)
    with pytest.raises(BudgetExceeded):
        led.reserve("ttl", "r2", 4, 1.0)
    import time

    time.sleep(0.3)
    assert led.status("ttl").epsilon_spent_or_reserved == 0.0
    with pytest.raises(LedgerError, match="expired, it cannot be committed"):
        led.commit("ttl", "r1", 100)
    led.reserve("ttl", "r2", 4, 1.0)
    assert [h["action"] for h in led.history("ttl")].count("expire") == 1


def test_the_ledger_stamps_and_expires_by_its_clock(ledger_url: str) -> None:
    clock = ManualClock(1_000.0)
    led = Ledger(ledger_url, clock=clock)
    led.init_budget(Budget("clk", 2.0, 1e-6, n_min=10, reservation_ttl=60.0, cost_model="ldp"))
    led.reserve("clk", "r1", 4, 2.0)
    clock.now += 59.0  # not yet expired: the wall clock plays no part
    with pytest.raises(BudgetExceeded):
        led.reserve("clk", "r2", 4, 1.0)
    clock.now += 2.0
    assert led.status("clk").epsilon_spent_or_reserved == 0.0  # status reads, writes nothing
    led.reserve("clk", "r2", 4, 1.0)  # the next write records the expiry
    history = led.history("clk")
    assert [h["at"] for h in history] == [1_000.0, 1_000.0, 1_059.0, 1_061.0, 1_061.0]
    assert [h["action"] for h in history] == ["init", "reserve", "reserve", "expire", "reserve"]
    assert history[-2]["detail"] == {"at": 1_061.0}


def test_the_ledger_api_refuses_values_no_round_can_have(tmp_path: Path) -> None:
    """A NaN batch size committed the round with no batch size; k = 10.7 was recorded as 10
    (its audit row said 10.7); k = 10**9 passed where the CLI and the wire stop at 65535."""
    led = Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    led.init_budget(Budget("d", 10.0, 1e-6, n_min=10))
    for k in (10.7, 10**9, True, 1):
        with pytest.raises(InvalidParameters):
            led.reserve("d", f"k{k}", k, 1.0)  # type: ignore[arg-type]
    led.reserve("d", "r1", np.int64(10), 1.0)  # type: ignore[arg-type]
    for size in (float("nan"), 1000.5, -1, "1000"):
        with pytest.raises(InvalidParameters):
            led.commit("d", "r1", size)  # type: ignore[arg-type]
    assert led.rounds_of("d")[0].status == "reserved"  # nothing changed
    assert led.commit("d", "r1", np.int64(20)).batch_size == 20  # type: ignore[arg-type]


def test_an_n_min_the_ledger_cannot_store_is_refused_on_every_backend(tmp_path: Path) -> None:
    """n_min = 3e9 was accepted by SQLite and refused by PostgreSQL ("integer out of range")."""
    led = Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    with pytest.raises(
        InvalidParameters,
        match=r"n_min must be a whole number in \[1, 2147483647\], got 3000000000",
    ):
        led.init_budget(Budget("d", 10.0, 1e-6, n_min=3_000_000_000))
    assert not led.has_budget("d")


def test_a_shuffled_guarantee_says_it_assumes_mix_0_follows_the_protocol() -> None:
    """A mix 0 that deviates can drop every honest report but one participant's and fill the
    batch itself (README, "Trust model, corrected"): only the ldp sum holds regardless."""
    for mode in ("planned", "adaptive"):
        tight = Budget("d", 1.0, 1e-6, n_min=100, cost_model="tight", mode=mode)
        assert "assumes mix 0 follows the protocol" in tight.guarantee()
    assert "mix 0" not in Budget("d", 1.0, 1e-6, n_min=100, cost_model="ldp").guarantee()


def test_a_ledger_upgraded_under_a_running_service_refuses_its_writes(ledger_url: str) -> None:
    """A newer shufflekit that brings the ledger forward while an older service has it open:
    every write of the older one is then refused (its rules may be stale), and nothing changes."""
    led = Ledger(ledger_url)
    led.init_budget(Budget("d", epsilon_total=5.0, delta_total=1e-6, n_min=100))
    led.reserve("d", "r1", 4, 1.0)
    engine = sa.create_engine(ledger_url)
    try:
        with engine.begin() as c:  # what the newer shufflekit's migration leaves
            c.execute(sa.text("update sk_schema_version set version = version + 1"))
        before = led.status("d")  # reads go on
        with pytest.raises(LedgerError, match=r"brought to schema version 7 while this"):
            led.reserve("d", "r2", 4, 1.0)
        with pytest.raises(LedgerError, match="stop this process"):
            led.commit("d", "r1", batch_size=200)
        assert led.status("d") == before
        assert [r.status for r in before.rounds] == ["reserved"]
    finally:
        engine.dispose()
        led.close()


def test_a_refund_refused_while_a_go_is_live_is_audited(ledger: Ledger) -> None:
    """A refund that waits for a mix's go is a decision like any other: the audit log says
    who asked, and until when the go held the round."""
    ledger.clock = clock = ManualClock(1_000.0)
    ledger.reserve("test", "r1", k=4, eps0=1.0)
    assert ledger.grant_go("test", "r1", clock.now + 60.0)
    with pytest.raises(LedgerError, match="cannot be refunded"):
        ledger.refund("test", "r1", actor="operator", reason="stuck")
    last = ledger.history("test")[-1]
    assert (last["actor"], last["action"], last["decision"]) == ("operator", "refund", "refused")
    assert last["detail"] == {"go_until": 1_060.0, "reason": "stuck"}
    assert ledger.round_of("test", "r1").status == "reserved"  # type: ignore[union-attr]
