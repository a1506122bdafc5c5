"""The blanket pair behind `tight`'s upper bound, summed row by row into curve cells
(`blanket_cells`) and put on composition grids from its exact curve (`curve_pld.blanket_pld`):
the cells equal the atoms added one by one, the curve equals the pair's closed form, and the
composed bounds sit between the same cells' lower hull and the atoms rounded up."""

from __future__ import annotations

import math

import numpy as np
import pytest

from shufflekit.accountant.blanket_cells import blanket_cells, blanket_loss_sd, blanket_rows
from shufflekit.accountant.composition import compose, compose_lower, default_grid, loss_sd
from shufflekit.accountant.core import Mechanism
from shufflekit.accountant.curve_cells import CurveCells, lower_grid
from shufflekit.accountant.curve_pld import CurvePLD, blanket_pld, composition_pld
from shufflekit.accountant.curves import pack_pld, unpack_pld
from shufflekit.accountant.numerics.binomial import log_pmf
from shufflekit.accountant.row_cells import Rows, add_rows, row_loss
from shufflekit.accountant.tight_upper import blanket_eval, tight_pld


def _one_by_one(rows: Rows, step: float) -> CurveCells:
    """The rows' outcomes added atom by atom, masses from `log_pmf` (not the recurrence)."""
    lo, hi = rows.loss_range()
    cells = CurveCells.empty(step, lo, hi, rel_error=2e-9)
    size = max(1, 2_000_000 // int(np.max(rows.chi - rows.clo) + 1))
    for i in range(0, rows.tt.size, size):
        tt, clo, chi = rows.tt[i : i + size], rows.clo[i : i + size], rows.chi[i : i + size]
        h = clo[:, None] + np.arange(int(np.max(chi - clo)) + 1)[None, :]
        ok = h <= chi[:, None]
        h = np.where(ok, h, clo[:, None])
        v = rows.v[i : i + size, 0]
        loss = row_loss(h, tt, v, 1.0)
        lm = rows.log_k[i : i + size, :1] + log_pmf(h, tt[:, None], 0.5) + np.log(h + v[:, None])
        cells.add(loss[ok], lm[ok])
    return cells


@pytest.mark.parametrize(
    ("n", "k", "eps0", "step"), [(100_000, 10, 1.0, 5e-5), (100_000, 3, 0.5, 2e-5)]
)
def test_cells_equal_the_atoms_one_by_one(n: int, k: int, eps0: float, step: float) -> None:
    """Both ways of summing (rows in closed form; `tight_pld`'s kernel, atom by atom) give the
    cells of the atoms added one by one with masses from `log_pmf` (built once: the slow part)."""
    mech = Mechanism(n=n, k=k, eps0=eps0)
    rows, sup = blanket_rows(mech)
    want = _one_by_one(rows, step)
    total = float(want.w.sum())
    assert total == pytest.approx(1.0, abs=1e-12)  # the rows hold all but the windows' tails
    for by_rows in (True, False):
        got = blanket_cells(mech, step, by_rows=by_rows)
        assert got.first == want.first and got.w.size == want.w.size, by_rows
        for name in ("w", "v"):
            a, b = getattr(got, name), getattr(want, name)
            assert np.max(np.abs(a - b)) <= 1e-13 * total, (name, by_rows)
            big = b > 1e-9 * b.max()
            assert np.max(np.abs(a[big] / b[big] - 1.0)) < 1e-9, (name, by_rows)
        assert math.exp(sup.log_inf) <= got.inf_mass < 1e-12, by_rows


@pytest.mark.parametrize(("n", "k", "eps0"), [(1_000_000, 10, 1.0), (300_000, 4, 2.0)])
def test_curve_is_the_pairs_closed_form(n: int, k: int, eps0: float) -> None:
    """The cells' curve at grid points equals the pair's hockey-stick divergence from its
    closed form (`blanket_eval`: partial expectations of whole binomial rows, an independent
    computation), within the cells' allowance and the mass their windows leave out."""
    mech = Mechanism(n=n, k=k, eps0=eps0)
    cells = blanket_cells(mech, 5e-5)
    h, allow = cells.curve()
    grid = blanket_rows(mech)[1].grid
    losses = cells.losses()
    sd = blanket_loss_sd(mech)
    checked = 0
    for j in np.linspace(0, losses.size - 1, 40).astype(int):
        eps = float(losses[j])
        if not 0 < eps < 6 * sd:
            continue
        exact = math.exp(blanket_eval(mech, grid, eps)[0])
        assert h[j] <= exact * (1 + 1e-9) + allow[j]
        assert h[j] + allow[j] + cells.inf_mass >= exact * (1 - 1e-9)
        assert h[j] == pytest.approx(exact, rel=1e-7, abs=cells.inf_mass + allow[j])
        checked += 1
    assert checked >= 6


def test_composed_between_the_lower_hull_and_the_atoms() -> None:
    """Ten rounds: the hull composes at or below the atoms rounded up (`tight_pld`, the same
    pair, first-order error) and above the same cells' lower hull (a lower bound of the pair),
    with a gap of under 0.2%."""
    mech = Mechanism(n=1_000_000, k=10, eps0=1.0)
    pld = blanket_pld(mech)
    assert isinstance(pld, CurvePLD)
    step = default_grid(10, [pld])
    upper = compose([pld], counts=[10], grid=step).epsilon(1e-9)
    atoms = compose([tight_pld(mech)], counts=[10], grid=step).epsilon(1e-9)
    cells = blanket_cells(mech, step)
    low = CurvePLD(
        pld.losses,
        pld.log_probs,
        -math.inf,
        "the blanket pair's lower hull",
        lambda s: lower_grid(cells, s, "blanket-lower", proper=True),
        False,
    )
    lower = compose_lower([low], counts=[10], grid=step).epsilon(1e-9)
    assert lower <= upper <= atoms * (1 + 1e-6)
    assert upper - lower < 2e-3 * upper
    assert atoms - upper < 2e-3 * upper


def test_few_users_sum_atoms_into_the_same_kind_of_pair() -> None:
    """Where rows cross about as many cells as they hold outcomes, summing them does not pay:
    the atoms go into the cells one by one (`tight_pld`'s kernel), and the pair is the same
    exact-curve hull, at or below the atoms rounded up from one round to many."""
    for mech in (Mechanism(n=1_000, k=10, eps0=1.0), Mechanism(n=100, k=3, eps0=8.0)):
        pld, atoms = blanket_pld(mech), tight_pld(mech)
        assert isinstance(pld, CurvePLD)
        for rounds in (1, 10, 300):
            step = default_grid(rounds, [atoms])
            upper = compose([pld], counts=[rounds], grid=step).epsilon(1e-6)
            assert upper <= compose([atoms], counts=[rounds], grid=step).epsilon(1e-6) * (1 + 1e-9)


def test_base_step_divides_the_default_grid() -> None:
    """The spread guess picks a base that the composition grid is a multiple of."""
    for n in (1_000_000, 10_000_000):
        mech = Mechanism(n=n, k=10, eps0=1.0)
        pld = blanket_pld(mech)
        assert isinstance(pld, CurvePLD) and pld.hull is not None
        assert blanket_loss_sd(mech) == pytest.approx(loss_sd(pld), rel=0.1)
        for rounds in (1, 10, 1000):
            ratio = default_grid(rounds, [pld]) / pld.hull[0]
            assert round(ratio) >= 1 and abs(ratio - round(ratio)) < 1e-9


def test_masses_below_a_float_go_to_inf() -> None:
    """A row whose masses underflow is not dropped silently: its bound joins +inf."""
    tt = np.array([4000.0])
    clo, chi = np.array([1800.0]), np.array([2200.0])
    rows = Rows(tt, clo, chi, np.array([[1e5]]), np.array([[-800.0]]), 1.0)
    cells = CurveCells.empty(1e-5, *rows.loss_range())
    lost = add_rows(cells, rows, 1e-5)
    assert cells.w.sum() == 0.0
    assert lost > 0.0


def test_reloaded_pair_composes_the_same() -> None:
    """The curve cache stores the hull's values: a pair read back composes to the same
    number as the fresh one, at the default grid and at another."""
    mech = Mechanism(n=1_000_000, k=10, eps0=1.0)
    fresh = blanket_pld(mech)
    again = unpack_pld(pack_pld(fresh))
    assert isinstance(again, CurvePLD)
    for step in (5e-5, 1e-4, 3.3e-5):
        a = compose([fresh], counts=[10], grid=step).epsilon(1e-9)
        b = compose([again], counts=[10], grid=step).epsilon(1e-9)
        assert a == b
    # a step that is no multiple of the base splits the hull there: sound, a little looser
    off = compose([fresh], counts=[10], grid=3.3e-5).epsilon(1e-9)
    assert compose([fresh], counts=[10], grid=5e-5).epsilon(1e-9) <= off * (1 + 1e-3)


@pytest.mark.parametrize(
    "mech", [Mechanism(n=100, k=3, eps0=8.0), Mechanism(n=1_000, k=2, eps0=1.0)]
)
def test_a_coarser_grid_ends_at_the_tail(mech: Mechanism) -> None:
    """On a multiple of the base step the hull ends at the tail bound (`vals[-1]`), not at the
    last sampled value before it (which put 3.7e-9 at +inf at n = 100, eps0 = 8: enough to
    fail 1,000 rounds at delta = 1e-6)."""
    pld = composition_pld(mech)
    assert isinstance(pld, CurvePLD) and pld.hull is not None
    base, _, vals = pld.hull
    for r in (2, 3, 7, 10):
        assert pld.on_grid(r * base, True).inf_mass == vals[-1]
