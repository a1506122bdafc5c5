"""The "all others at z" attack summed row by row in closed form (`attack_cells`) gives the same
curve cells, and so the same composed lower bounds, as its outcomes added one by one."""

from __future__ import annotations

import numpy as np
import pytest

from shufflekit.accountant import attack_cells, curve_pld, row_cells
from shufflekit.accountant.attack_cells import all_at_z_cells, all_at_z_loss_sd
from shufflekit.accountant.attack_pld import dataset_atoms
from shufflekit.accountant.composition import compose_lower, compose_rounds_bounds, loss_sd
from shufflekit.accountant.core import Mechanism
from shufflekit.accountant.curve_cells import CurveCells
from shufflekit.base.errors import UnsoundResult


def _one_by_one(mech: Mechanism, step: float) -> CurveCells:
    cells = CurveCells.empty(step, -mech.eps0, mech.eps0, rel_error=1e-7)
    for loss, lm in dataset_atoms(mech, dataset="all_at_z"):
        cells.add(loss, lm)
    return cells


def _no_atoms(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the one-by-one path fail, so that a test sees the closed-form rows at work."""

    def refuse(*_: object) -> None:
        raise AssertionError("summed atom by atom")

    monkeypatch.setattr(attack_cells, "iter_all_at_z", refuse)


@pytest.mark.parametrize(
    ("n", "k", "eps0", "step"),
    [(250_000, 3, 1.0, 5e-5), (200_000, 10, 1.0, 5e-5), (300_000, 5, 0.3, 5e-6)],
)
def test_rows_give_the_cells_of_the_atoms(
    monkeypatch: pytest.MonkeyPatch, n: int, k: int, eps0: float, step: float
) -> None:
    mech = Mechanism(n=n, k=k, eps0=eps0)
    want = _one_by_one(mech, step)
    _no_atoms(monkeypatch)
    got = all_at_z_cells(mech, step, -eps0, eps0)
    assert got.first == want.first and got.w.size == want.w.size
    total = float(want.w.sum())
    for field in ("w", "v"):
        a, b = getattr(got, field), getattr(want, field)
        assert np.max(np.abs(a - b)) <= 1e-13 * total, field
        big = b > 1e-9 * b.max()
        assert np.max(np.abs(a[big] / b[big] - 1.0)) < 1e-9, field
    # d = w - v per cell: its error is relative to the cell's mass (1e-7 is what cells allow)
    assert np.all(np.abs(got.d - want.d) <= 1e-12 * want.w + 1e-300)
    h_got, _ = got.curve()
    h_want, allow = want.curve()
    assert np.all(np.abs(h_got - h_want) <= 1e-3 * allow)


def test_few_users_are_summed_one_by_one() -> None:
    """Where rows cross about as many cells as they have outcomes, the atoms are cheaper: the
    cells are then exactly the one-by-one cells."""
    mech = Mechanism(n=2_000, k=4, eps0=1.0)
    got, want = all_at_z_cells(mech, 5e-5, -1.0, 1.0), _one_by_one(mech, 5e-5)
    for field in ("w", "v", "d"):
        assert np.array_equal(getattr(got, field), getattr(want, field))


def test_a_drifting_row_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """The products are checked against log_pmf; a drift beyond the tolerance is an error,
    never a silently wrong curve."""
    monkeypatch.setattr(row_cells, "RECURRENCE_TOL", -1.0)
    with pytest.raises(UnsoundResult, match="drifted"):
        all_at_z_cells(Mechanism(n=250_000, k=3, eps0=1.0), 5e-5, -1.0, 1.0)


def test_composed_attack_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ten rounds of the attack composed from the rows equal those composed from the atoms."""
    mech = Mechanism(n=200_000, k=10, eps0=1.0)
    new = compose_lower([curve_pld.attack_curve_pld(mech)], counts=[10], grid=5e-5)
    monkeypatch.setattr(
        curve_pld,
        "all_at_z_cells",
        lambda m, step, lo, hi: _one_by_one(m, step),
    )
    old = compose_lower([curve_pld.attack_curve_pld(mech)], counts=[10], grid=5e-5)
    for delta in (1e-5, 1e-9):
        assert new.epsilon(delta) == pytest.approx(old.epsilon(delta), rel=1e-9)


def test_loss_spread_guess_is_close() -> None:
    """The guessed spread (it picks the cells' step) is within 5% of the pair's."""
    for n, k, eps0 in [(10_000, 3, 1.0), (1_000_000, 10, 1.0), (300_000, 5, 4.0)]:
        mech = Mechanism(n=n, k=k, eps0=eps0)
        got = all_at_z_loss_sd(mech)
        assert got == pytest.approx(loss_sd(curve_pld.attack_curve_pld(mech)), rel=0.05)


def test_large_n_attack_is_summed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """With little loss spread the composition grid is finer than 5e-5: the cells are built
    once, at a step it is a multiple of (they were built twice, ~1 min each at n = 1e7)."""
    calls: list[float] = []
    real = curve_pld.all_at_z_cells

    def counted(mech: Mechanism, step: float, lo: float, hi: float) -> CurveCells:
        calls.append(step)
        return real(mech, step, lo, hi)

    monkeypatch.setattr(curve_pld, "all_at_z_cells", counted)
    mech = Mechanism(n=5_000_000, k=10, eps0=1.0)
    bounds = compose_rounds_bounds([mech], counts=[10])
    assert bounds.upper.step < 5e-5
    assert len(calls) == 1, calls
    ratio = bounds.upper.step / calls[0]
    assert round(ratio) >= 1 and abs(ratio - round(ratio)) < 1e-9
    lower, upper = bounds.epsilon(1e-9)
    assert lower is not None and lower <= upper
