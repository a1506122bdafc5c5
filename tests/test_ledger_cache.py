"""The persisted curve cache: status of a ledger reopened elsewhere is served from stored curves
(computed nothing), a new engine version computes afresh, and the cached totals equal a direct
computation."""

from __future__ import annotations

from pathlib import Path

import pytest

from shufflekit.accountant import curves
from shufflekit.accountant.composition import compose_rounds
from shufflekit.accountant.core import Mechanism
from shufflekit.accountant.ledger import Budget, Ledger
from shufflekit.accountant.round_types import parse_round_type


def test_status_is_served_from_the_stored_curves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'c.db'}"
    led = Ledger(url)
    led.init_budget(Budget("c", 5.0, 1e-6, n_min=2000, schedule=(parse_round_type("10,2"),)))
    for i, batch in enumerate((2000, 2057, 2111)):
        led.reserve("c", f"r{i}", 10, 2.0)
        led.commit("c", f"r{i}", batch)
    first = led.status("c")
    assert [r.n_accounted for r in first.rounds] == [2000, 2050, 2110]  # 3 significant digits
    direct = compose_rounds([Mechanism(n, 10, 2.0) for n in (2000, 2050, 2110)]).epsilon(1e-6)
    assert first.epsilon_committed == pytest.approx(direct, rel=1e-12)

    again = Ledger(url)  # another process: nothing in memory
    st = again.status("c")
    assert (st.epsilon_committed, st.epsilon_spent_or_reserved) == (
        first.epsilon_committed,
        first.epsilon_spent_or_reserved,
    )
    assert again.curves.computed == 0 and again.curves.loaded >= 1

    monkeypatch.setattr(curves, "engine_version", lambda: "another-engine-version")
    changed = Ledger(url)
    assert changed.status("c").epsilon_committed == pytest.approx(direct, rel=1e-12)
    assert changed.curves.computed >= 1  # a new version never reads the old curves


def test_engine_version_tracks_the_accountant_source() -> None:
    v = curves.engine_version()
    assert len(v) == 16 and v == curves.engine_version()
    assert curves.CurveCache().key("pld", "x").split("|")[:3] == ["pld", curves.ENGINE, v]
