"""The "all others at z" attack (k >= 3) summed straight into curve cells, a row of outcomes
at a time (`row_cells`), instead of one atom per outcome (`attack_pld.iter_all_at_z` +
`CurveCells.add`).

Given the total T = h_x0 + h_x1 and the h_z bin (`attack_pld.z_view`), h_x0 ~ Bin(T, 1/2)
tilted by a0(h) = (1 - gamma) h + V under P (target at x0) and by a1(h) = (1 - gamma)(T - h)
+ V under Q: the rows of `row_cells` with alpha = 1 - gamma and one column per h_z bin. Measured
6-12x faster than one by one at n = 1e6-3e6 (`benchmarks/bench_attack_cells.py`), the same
cells to 1e-13 (`tests/test_attack_cells.py`).
"""

from __future__ import annotations

import math

from shufflekit.accountant.attack_pld import LOG_TAU, Z_BINS, iter_all_at_z, z_view
from shufflekit.accountant.core import Mechanism
from shufflekit.accountant.curve_cells import CurveCells
from shufflekit.accountant.numerics.binomial import log_pmf, tail_window
from shufflekit.accountant.row_cells import Rows, add_rows, rows_pay
from shufflekit.base.errors import InvalidParameters


def all_at_z_cells(
    mech: Mechanism,
    step: float,
    lo: float,
    hi: float,
    *,
    log_tau: float = LOG_TAU,
    z_bins: int = Z_BINS,
) -> CurveCells:
    """The cells (base step `step`, losses [lo, hi]) of the exact pair of "all others at z":
    the same sums as adding `attack_pld.dataset_atoms(mech, dataset="all_at_z")` one by one
    (a mass below the smallest float is left out: this is a lower bound's pair)."""
    if mech.k < 3:
        raise InvalidParameters("all_at_z needs k >= 3")
    cells = CurveCells.empty(step, lo, hi, rel_error=1e-7)
    t_all, bin_lw, bin_v = z_view(mech, log_tau, z_bins)
    log_t = log_pmf(t_all, mech.n, 2 * mech.krr.q) - math.log(mech.n * mech.krr.q)
    clo, chi = tail_window(t_all, 0.5, log_tau)
    rows = Rows(t_all, clo, chi, bin_v, log_t[:, None] + bin_lw, 1.0 - mech.krr.gamma)
    if not rows_pay(rows, rows.crossings(step)[1]):
        # few users: rows cross about as many cells as they have outcomes; one by one
        for loss, lm in iter_all_at_z(mech, log_tau, z_bins):
            cells.add(loss, lm)
        return cells
    add_rows(cells, rows, step)
    return cells


def all_at_z_loss_sd(mech: Mechanism) -> float:
    """About the standard deviation of the pair's privacy loss (to choose a cell step): the
    loss is near-linear in h_x0 with slope 4 alpha / (alpha T + 2V) at the mode, and h_x0
    given T has standard deviation sqrt(T) / 2; T and the h_z bin at their means."""
    rr = mech.krr
    alpha, t = 1.0 - rr.gamma, 2.0 * rr.q * mech.n
    kappa = -math.expm1(-mech.eps0)
    v = (rr.gamma / mech.k) * (mech.n - kappa * (mech.n - t) * rr.p / (1.0 - 2.0 * rr.q))
    return 2.0 * alpha * math.sqrt(t) / (alpha * t + 2.0 * v)
