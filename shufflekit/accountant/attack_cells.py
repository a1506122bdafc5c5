"""The "all others at z" attack (k >= 3) summed straight into curve cells, a row of outcomes
at a time, instead of one atom per outcome (`attack_pld.iter_all_at_z` + `CurveCells.add`).

Given the total T = h_x0 + h_x1 and the h_z bin (`attack_pld.z_view`), h_x0 ~ Bin(T, 1/2)
tilted by a0(h) = (1 - gamma) h + V under P (target at x0) and by a1(h) = (1 - gamma)(T - h)
+ V under Q; the loss log a0/a1 increases with h and is 0 at the mode h = T/2. So each cell
of the curve is an interval of h in closed form (its ends fixed as the atoms' own float
losses place them), and its sums are interval sums of Bin(T, 1/2) times 1, h and T - h:
w = K (alpha S_h + V S_1), v = e^(c s) K (alpha S_(T-h) + V S_1), d = w - v. The row is the
product of its ratios (checked against `numerics.binomial.log_pmf`), the interval sums are
differences of running sums over the lower half only, a cell above the mode taken as its
mirror image h -> T - h: every sum runs from the far tail towards the mode, so a cell's error
is relative to the mass beyond it (about 1e-11 of the mass at and above each grid point; the
cells allow 1e-7). The work per outcome is a handful of array passes on half the row, shared
by the h_z bins: measured 6-12x faster than one by one at n = 1e6-3e6
(`benchmarks/bench_attack_cells.py`), the same cells to 1e-13 (`tests/test_attack_cells.py`).
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import numpy.typing as npt

from shufflekit.accountant.attack_pld import LOG_TAU, Z_BINS, iter_all_at_z, z_view
from shufflekit.accountant.core import Mechanism
from shufflekit.accountant.curve_cells import CurveCells
from shufflekit.accountant.numerics.binomial import log_pmf, tail_window
from shufflekit.accountant.numerics.logspace import FloatArray
from shufflekit.accountant.tight_k2 import WORKERS
from shufflekit.base.errors import InvalidParameters, UnsoundResult

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
CellSums = tuple[IntArray, FloatArray, FloatArray]
"""Cells (absolute numbers) with their P-masses w and scaled Q-masses v (see `CurveCells`)."""

#: Outcomes (T, h_x0) held at once: rows of one chunk times their window.
CHUNK_OUTCOMES = 1 << 20
_RECURRENCE_TOL = 1e-9  # largest error of the row's log pmf accepted (the cells allow 1e-7)


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
    the same sums as adding `attack_pld.dataset_atoms(mech, dataset="all_at_z")` one by one."""
    if mech.k < 3:
        raise InvalidParameters("all_at_z needs k >= 3")
    cells = CurveCells.empty(step, lo, hi, rel_error=1e-7)
    alpha = 1.0 - mech.krr.gamma
    t_all, bin_lw, bin_v = z_view(mech, log_tau, z_bins)
    log_t = log_pmf(t_all, mech.n, 2 * mech.krr.q) - math.log(mech.n * mech.krr.q)
    clo, chi = tail_window(t_all, 0.5, log_tau)
    firsts, crossed = zip(
        *(_first_cells(t_all, clo, chi, v, alpha, step) for v in bin_v.T), strict=True
    )
    if 2 * np.median(np.max(crossed, axis=0)) >= np.median(chi - clo + 1):
        # few users: rows cross about as many cells as they have outcomes; one by one
        for loss, lm in iter_all_at_z(mech, log_tau, z_bins):
            cells.add(loss, lm)
        return cells
    parts, start = [], 0
    while start < t_all.size:
        rows = max(1, CHUNK_OUTCOMES // (int(chi[start] - clo[start]) + 1))
        parts.append(slice(start, start + rows))
        start += rows

    def sums(part: slice) -> list[CellSums]:
        """A chunk's cell sums, bin by bin (on a worker thread: numpy releases the GIL)."""
        row = _Row(t_all[part], clo[part], chi[part])
        out = []
        for b in range(bin_v.shape[1]):
            span = int(np.max(crossed[b][part]))
            edges = firsts[b][part, None] + np.arange(span + 1, dtype=np.float64)[None, :]
            log_k = log_t[part] + bin_lw[part, b] + row.log_scale
            out.append(_cell_sums(row, edges, bin_v[part, b], log_k, alpha, step))
        return out

    with ThreadPoolExecutor(WORKERS) as pool:  # WORKERS chunks at a time: bounded memory
        for i in range(0, len(parts), WORKERS):
            for chunk in pool.map(sums, parts[i : i + WORKERS]):
                for cell, w, v in chunk:
                    cells.add_sums(cell, w, v)
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


def _loss(h: FloatArray, tt: FloatArray, v: FloatArray, alpha: float) -> FloatArray:
    """The privacy loss log a0 / a1 of outcome h given T (rows of tt, v), as the atoms have it."""
    t2, v2 = tt[:, None], v[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.asarray(np.log(alpha * h + v2) - np.log(alpha * (t2 - h) + v2))


def _first_cells(
    tt: FloatArray, clo: FloatArray, chi: FloatArray, v: FloatArray, alpha: float, step: float
) -> tuple[FloatArray, FloatArray]:
    """Per row (total T, blanket term v) the cell of its first outcome, and how many cells its
    outcomes cross."""
    ends = _loss(np.stack([clo, chi], axis=1), tt, v, alpha)
    first = np.floor(ends[:, 0] / step)
    return first, np.floor(ends[:, 1] / step) - first + 1


def _cell_sums(
    row: _Row, edges: FloatArray, v: FloatArray, log_k: FloatArray, alpha: float, step: float
) -> CellSums:
    """One h_z bin of a chunk: per row the cells [c s, (c + 1) s) for c in `edges`, each an
    interval of h (masses log_k + the row's, times a0 under P, a1 under Q): (cells, w, v)."""
    ex = np.exp(edges * step)
    t2, v2 = row.tt[:, None], v[:, None]
    at = np.ceil((ex * (alpha * t2 + v2) - v2) / (alpha * (1.0 + ex)))  # loss(at) ~ c s
    at -= _loss(at - 1.0, row.tt, v, alpha) >= edges * step  # the first h at or above each
    at += _loss(at, row.tt, v, alpha) < edges * step  # edge, as `_loss` rounds
    jb = np.clip(at - row.clo[:, None], 0, row.width[:, None]).astype(np.int64)
    jb[:, 0] = 0
    ja, jz, cell = jb[:, :-1], jb[:, 1:], edges[:, :-1]
    s1, sh, st = row.sums(ja, jz, cell >= 0)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        w = np.exp(log_k[:, None] + np.log(alpha * sh + v2 * s1))
        q = np.exp(log_k[:, None] + np.log(alpha * st + v2 * s1) + cell * step)
    keep = (jz > ja) & (w > 0) & np.isfinite(w) & np.isfinite(q)
    return cell[keep].astype(np.int64), w[keep], q[keep]


class _Row:
    """Bin(T, 1/2) on the lower half of the windows [clo, chi] (symmetric: clo + chi = T) of a
    chunk of totals T, relative to each row's first point (log pmf `log_scale`), with running
    sums of the masses times 1 and h; a cell above the mode is summed as its mirror image
    h -> T - h (`sums`)."""

    def __init__(self, tt: FloatArray, clo: FloatArray, chi: FloatArray) -> None:
        if np.any(clo + chi != tt):
            raise UnsoundResult("binomial windows of p = 1/2 must be symmetric")
        self.tt, self.clo, self.width = tt, clo, chi - clo + 1
        half = min(int(self.width.max()) // 2 + 2, int(self.width.max()))
        j = np.arange(half, dtype=np.float64)
        # P(h + 1) / P(h) = (T - h) / (h + 1), multiplied up from the first point: the
        # products lose at most `half` roundings (< 1e-11 relative at n = 1e9), checked below
        pm = np.empty((tt.size, half))
        pm[:, 0] = 1.0
        np.divide(chi[:, None] - j[None, :-1], clo[:, None] + 1.0 + j[None, :-1], out=pm[:, 1:])
        np.cumprod(pm, axis=1, out=pm)
        pm[j[None, :] >= self.width[:, None]] = 0.0  # past chi (narrower rows of the chunk)
        self.log_scale = log_pmf(clo, tt, 0.5)
        self._check(pm, self.log_scale, tt, clo, chi)
        self._stride = half + 1
        self._sums = []
        for x in (pm, pm * j[None, :]):
            fwd = np.zeros((tt.size, half + 1))
            np.cumsum(x, axis=1, out=fwd[:, 1:])
            self._sums.append(fwd.ravel())

    @staticmethod
    def _check(
        pm: FloatArray, log_scale: FloatArray, tt: FloatArray, clo: FloatArray, chi: FloatArray
    ) -> None:
        """UnsoundResult unless the products meet `log_pmf` at each row's last point."""
        last = np.minimum(clo + pm.shape[1] - 1, chi)
        got = np.log(pm[np.arange(tt.size), (last - clo).astype(np.int64)]) + log_scale
        if np.max(np.abs(got - log_pmf(last, tt, 0.5))) > _RECURRENCE_TOL:
            raise UnsoundResult("binomial row recurrence drifted from log_pmf")

    def sums(
        self, ja: IntArray, jz: IntArray, right: BoolArray
    ) -> tuple[FloatArray, FloatArray, FloatArray]:
        """Sums over h in [clo + ja, clo + jz) of the masses times 1, h and T - h; where
        `right` (the cell is at or above the mode) over the mirror image [T - h] (so each
        sum runs from the far tail towards the mode)."""
        wd = self.width[:, None].astype(np.int64)
        base = (np.arange(ja.shape[0]) * self._stride)[:, None]
        hi = base + np.where(right, wd - ja, jz)
        lo = base + np.where(right, wd - jz, ja)
        s1, sj = (np.take(x, hi) - np.take(x, lo) for x in self._sums)
        sx = self.clo[:, None] * s1 + sj  # masses times x = clo + j
        t = self.tt[:, None]
        t_minus = t * s1 - sx  # sum of masses times T - x over the summed x (x <= T/2)
        return s1, np.where(right, t_minus, sx), np.where(right, sx, t_minus)
