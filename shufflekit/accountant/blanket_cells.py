"""The blanket pair behind `tight`'s upper bound (k-RR, others' blanket bits revealed) summed
into curve cells row by row (`row_cells`), for its exact-curve PLD (`curve_pld.blanket_pld`).

Row (bucket of B at its smallest b, T = c0 + c1) of `tight_upper.blanket_support`: c0 ~
Bin(T, 1/2) tilted by alpha_b (c0 + beta_b) under P and alpha_b (T - c0 + beta_b) under Q, the
rows of `row_cells` with alpha = 1, v = beta_b and the scale alpha_b times the row's weight.
Every mass `tight_pld` leaves out (B, T and c0 outside their windows) and every mass too small
for a float is kept as a bound on P(loss = +inf), so the curve of the cells plus it bounds
the pair's curve from above at every point.
"""

from __future__ import annotations

import math

import numpy as np

from shufflekit.accountant.core import Mechanism
from shufflekit.accountant.curve_cells import CurveCells
from shufflekit.accountant.numerics.logspace import logsumexp
from shufflekit.accountant.row_cells import Rows, add_rows, rows_pay
from shufflekit.accountant.tight_upper import BlanketSupport, blanket_atoms, blanket_support

LOG_TAU = -32.0  # the windows' truncation level, as `tight_pld`'s
LOG_DELTA_HINT = -14.0
#: Relative error allowed for each cell's masses: twice the row recurrence's tolerance
#: (`row_cells.RECURRENCE_TOL`); the log-space weights, sums and atoms are far more accurate.
REL_ERROR = 2e-9


def blanket_rows(mech: Mechanism) -> tuple[Rows, BlanketSupport]:
    """The pair's rows (`row_cells`) and the support they come from."""
    sup = blanket_support(mech, LOG_TAU, LOG_DELTA_HINT)
    log_k = sup.grid.log_weight + np.log(sup.alpha)
    rows = Rows(sup.grid.t, sup.clo, sup.chi, sup.beta[:, None], log_k[:, None], 1.0)
    return rows, sup


def blanket_cells(mech: Mechanism, step: float, *, by_rows: bool | None = None) -> CurveCells:
    """The pair's cells at base step `step` over the losses it reaches, with `inf_mass` an
    upper bound on everything left out of them (outside the windows, or below a float).

    by_rows: sum each row in closed form (`row_cells.add_rows`), or add its atoms one by one
    (`tight_upper.blanket_atoms`, the kernel of `tight_pld`); None: rows where they pay
    (`row_cells.rows_pay`: rows crossing well under half as many cells as they hold outcomes).
    """
    rows, sup = blanket_rows(mech)
    lo, hi = rows.loss_range()
    cells = CurveCells.empty(step, lo, hi, rel_error=REL_ERROR)
    if by_rows is None:
        by_rows = rows_pay(rows, rows.crossings(step)[1])
    if by_rows:
        lost = add_rows(cells, rows, step)
    else:
        tiny = [-math.inf]
        for loss, lm_up, keep_up, lm_mirror, keep_mirror in blanket_atoms(sup, tiny):
            cells.add(loss[keep_up], lm_up[keep_up])
            cells.add(-loss[keep_mirror], lm_mirror[keep_mirror])
        lost = math.exp(logsumexp(np.array(tiny)))
    cells.inf_mass = math.exp(sup.log_inf) + lost
    return cells


def blanket_loss_sd(mech: Mechanism) -> float:
    """About the standard deviation of the pair's privacy loss (to choose a cell step): the
    loss is near-linear in c0 with slope 4 / (T + 2 beta) at the mode and c0 given T has
    standard deviation sqrt(T) / 2; B and T at their means."""
    g, k = mech.gamma, mech.k
    b1 = g * (mech.n - 1) + 1.0
    t = 2.0 * b1 / k
    beta = g * b1 / ((1.0 - g) * k)
    return 2.0 * math.sqrt(t) / (t + 2.0 * beta)
