"""The budget ledger: lifecycle, refusals, audit log, and clear errors that change nothing."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from accountant.errors import BudgetExceeded, InvalidParameters, LedgerError
from accountant.ledger import Budget, Ledger


def test_reserve_commit_refund_lifecycle(ledger: Ledger) -> None:
    ledger.reserve("test", "r1", k=4, eps0=2.0)
    ledger.reserve("test", "r2", k=4, eps0=3.0)
    st = ledger.status("test")
    assert (st.epsilon_spent, st.epsilon_reserved) == (0.0, 5.0)
    ledger.commit("test", "r1", batch_size=100)
    ledger.commit("test", "r1", batch_size=100)  # idempotent
    ledger.refund("test", "r2", reason="aborted")
    st = ledger.status("test")
    assert (st.epsilon_spent, st.epsilon_reserved, st.epsilon_remaining) == (2.0, 2.0, 8.0)
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
    ):
        with pytest.raises(InvalidParameters):
            ledger.init_budget(b)
    with pytest.raises(LedgerError, match="already has a budget"):
        ledger.init_budget(Budget("test", 1.0, 1e-6, 10, cost_model="ldp"))


def test_foreign_corrupt_and_wrong_urls(tmp_path: Path) -> None:
    foreign = tmp_path / "foreign.db"
    with sqlite3.connect(foreign) as c:
        c.execute("create table customers (id int)")
    with pytest.raises(LedgerError, match="foreign"):
        Ledger(f"sqlite:///{foreign}")
    with sqlite3.connect(foreign) as c:  # nothing was written
        names = [r[0] for r in c.execute("select name from sqlite_master")]
    assert names == ["customers"]
    corrupt = tmp_path / "corrupt.db"
    corrupt.write_bytes(b"this is not a database" * 100)
    before = corrupt.read_bytes()
    with pytest.raises(LedgerError):
        Ledger(f"sqlite:///{corrupt}")
    assert corrupt.read_bytes() == before
    for url in ("not a url", "mysql://u@h/db"):
        with pytest.raises(LedgerError):
            Ledger(url)


def test_schema_1_ledger_is_migrated_forward(tmp_path: Path) -> None:
    db = tmp_path / "v1.db"
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
    led = Ledger(f"sqlite:///{db}")
    assert led.status("old").epsilon_spent == 1.5
    led.reserve("old", "r2", 4, 1.0)  # the new columns work
    with sqlite3.connect(db) as c:
        assert c.execute("select version from sk_schema_version").fetchall() == [(2,)]
    with sqlite3.connect(db) as c:
        c.execute("update sk_schema_version set version = 99")
    with pytest.raises(LedgerError, match="newer than this shufflekit"):
        Ledger(f"sqlite:///{db}")


def test_expired_reservation_stops_counting_and_cannot_be_committed(ledger_url: str) -> None:
    led = Ledger(ledger_url)
    led.init_budget(Budget("ttl", 2.0, 1e-6, n_min=10, reservation_ttl=0.2, cost_model="ldp"))
    led.reserve("ttl", "r1", 4, 2.0)
    with pytest.raises(BudgetExceeded):
        led.reserve("ttl", "r2", 4, 1.0)
    import time

    time.sleep(0.3)
    assert led.status("ttl").epsilon_reserved == 0.0
    with pytest.raises(LedgerError, match="expired, it cannot be committed"):
        led.commit("ttl", "r1", 100)
    led.reserve("ttl", "r2", 4, 1.0)
    assert [h["action"] for h in led.history("ttl")].count("expire") == 1
