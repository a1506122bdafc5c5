"""Curve cells of a pair whose outcomes come in rows of Bin(T, 1/2), summed a row at a time in
closed form instead of one atom per outcome (`CurveCells.add`).

Both k >= 3 pairs have this shape: the attack "all others at z" (`attack_cells`) and the
blanket pair behind `tight`'s upper bound (`blanket_cells`). Given a row (total T and, per
column, a blanket term v and a log scale log_K), outcome h in the row's window has P-mass
K Bin(T, 1/2)(h) a0(h) and Q-mass K Bin(T, 1/2)(h) a1(h), with a0(h) = alpha h + v and
a1(h) = alpha (T - h) + v; the loss log a0/a1 increases with h and is 0 at the mode h = T/2.
So each cell of the curve is an interval of h (its ends fixed as the atoms' own float losses
place them, `row_loss`), and its sums are interval sums of Bin(T, 1/2) times 1, h and T - h:
w = K (alpha S_h + v S_1), v_cell = e^(c s) K (alpha S_(T-h) + v S_1), d = w - v_cell.

The row is the product of its ratios (checked against `numerics.binomial.log_pmf`), the
interval sums are differences of running sums over the lower half only, a cell above the mode
taken as its mirror image h -> T - h: every sum runs from the far tail towards the mode, so a
cell's error is relative to the mass beyond it (about 1e-11 of the mass at and above each grid
point). The work per outcome is a handful of array passes on half the row, shared by the
columns: measured 6-12x faster than one by one (`benchmarks/bench_attack_cells.py`), the same
cells to 1e-13 (`tests/test_attack_cells.py`, `tests/test_blanket_cells.py`).
"""

from __future__ import annotations

import math
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from shufflekit.accountant.curve_cells import CurveCells
from shufflekit.accountant.numerics.binomial import log_pmf
from shufflekit.accountant.tight_k2 import WORKERS
from shufflekit.base.arrays import BoolArray, FloatArray, IntArray
from shufflekit.base.errors import UnsoundResult

CellSums = tuple[IntArray, FloatArray, FloatArray]
"""Cells (absolute numbers) with their P-masses w and scaled Q-masses v (see `CurveCells`)."""

#: Outcomes (T, h) held at once: rows of one chunk times their window.
CHUNK_OUTCOMES = 1 << 20
RECURRENCE_TOL = 1e-9  # largest error of the row's log pmf accepted (cells allow >= 2e-9)
LOG_MASS_FLOOR = -745.0  # a mass below e^this is 0 in float: `add_rows` bounds what falls there


@dataclass(frozen=True)
class Rows:
    """The rows of a pair (see the module docstring): per row the total `tt` and its window
    [clo, chi] of h (symmetric about T/2), per row and column the blanket term `v` and the log
    scale `log_k`; `alpha` the tilt of h."""

    tt: FloatArray
    clo: FloatArray
    chi: FloatArray
    v: FloatArray  # (rows, columns)
    log_k: FloatArray  # (rows, columns)
    alpha: float

    def crossings(self, step: float) -> tuple[FloatArray, FloatArray]:
        """Per column and row: the cell of the row's first outcome and how many cells its
        outcomes cross, arrays of shape (columns, rows)."""
        ends = [
            row_loss(np.stack([self.clo, self.chi], axis=1), self.tt, v, self.alpha)
            for v in self.v.T
        ]
        first = np.stack([np.floor(e[:, 0] / step) for e in ends])
        last = np.stack([np.floor(e[:, 1] / step) for e in ends])
        return first, last - first + 1

    def loss_range(self) -> tuple[float, float]:
        """The smallest and largest loss of any outcome."""
        los = [row_loss(self.clo[:, None], self.tt, v, self.alpha) for v in self.v.T]
        his = [row_loss(self.chi[:, None], self.tt, v, self.alpha) for v in self.v.T]
        return float(min(np.min(x) for x in los)), float(max(np.max(x) for x in his))


def row_loss(h: FloatArray, tt: FloatArray, v: FloatArray, alpha: float) -> FloatArray:
    """The privacy loss log a0 / a1 of outcomes h (columns) given T (rows of tt, v)."""
    t2, v2 = tt[:, None], v[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.asarray(np.log(alpha * h + v2) - np.log(alpha * (t2 - h) + v2))


def rows_pay(rows: Rows, crossed: FloatArray) -> bool:
    """Whether summing in closed form beats adding atoms: rows cross well under half as many
    cells as they have outcomes (with few users every outcome is a cell of its own)."""
    return bool(2 * np.median(np.max(crossed, axis=0)) < np.median(rows.chi - rows.clo + 1))


def add_rows(cells: CurveCells, rows: Rows, step: float) -> float:
    """Add every outcome of `rows` to `cells` (base step `step`), a row at a time in closed
    form, chunks on WORKERS threads. Returns a bound on the P-mass left out because it was
    below the smallest float (each such cell's mass is below e^-745)."""
    firsts, crossed = rows.crossings(step)
    parts, start = [], 0
    while start < rows.tt.size:
        size = max(1, CHUNK_OUTCOMES // (int(rows.chi[start] - rows.clo[start]) + 1))
        parts.append(slice(start, start + size))
        start += size

    def sums(part: slice) -> tuple[list[CellSums], int]:
        """A chunk's cell sums, column by column (on a worker thread: numpy releases the GIL),
        and how many of its cells hold a mass too small for a float."""
        row = _Row(rows.tt[part], rows.clo[part], rows.chi[part])
        out, lost = [], 0
        for b in range(rows.v.shape[1]):
            span = int(np.max(crossed[b][part]))
            edges = firsts[b][part, None] + np.arange(span + 1, dtype=np.float64)[None, :]
            log_k = rows.log_k[part, b] + row.log_scale
            cell, w, v, tiny = _cell_sums(row, edges, rows.v[part, b], log_k, rows.alpha, step)
            out.append((cell, w, v))
            lost += tiny
        return out, lost

    lost = 0
    with ThreadPoolExecutor(WORKERS) as pool:  # WORKERS chunks at a time: bounded memory
        for i in range(0, len(parts), WORKERS):
            for chunk, tiny in pool.map(sums, parts[i : i + WORKERS]):
                lost += tiny
                for cell, w, v in chunk:
                    cells.add_sums(cell, w, v)
    return lost * math.exp(LOG_MASS_FLOOR + 1.0)


def _cell_sums(
    row: _Row, edges: FloatArray, v: FloatArray, log_k: FloatArray, alpha: float, step: float
) -> tuple[IntArray, FloatArray, FloatArray, int]:
    """One column of a chunk: per row the cells [c s, (c + 1) s) for c in `edges`, each an
    interval of h (masses log_k + the row's, times a0 under P, a1 under Q): (cells, w, v, how
    many non-empty cells hold a mass below the smallest float)."""
    ex = np.exp(edges * step)
    t2, v2 = row.tt[:, None], v[:, None]
    at = np.ceil((ex * (alpha * t2 + v2) - v2) / (alpha * (1.0 + ex)))  # loss(at) ~ c s
    at -= row_loss(at - 1.0, row.tt, v, alpha) >= edges * step  # the first h at or above
    at += row_loss(at, row.tt, v, alpha) < edges * step  # each edge, as `row_loss` rounds
    jb = np.clip(at - row.clo[:, None], 0, row.width[:, None]).astype(np.int64)
    jb[:, 0] = 0
    ja, jz, cell = jb[:, :-1], jb[:, 1:], edges[:, :-1]
    s1, sh, st = row.sums(ja, jz, cell >= 0)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        w = np.exp(log_k[:, None] + np.log(alpha * sh + v2 * s1))
        q = np.exp(log_k[:, None] + np.log(alpha * st + v2 * s1) + cell * step)
    full = jz > ja
    if np.any(full & ~(np.isfinite(w) & np.isfinite(q))):
        raise UnsoundResult("a row's cell sums are not finite")
    keep = full & (w > 0)
    return cell[keep].astype(np.int64), w[keep], q[keep], int(np.count_nonzero(full & (w == 0)))


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
        pm, tmp = _scratch("pm", (tt.size, half)), _scratch("tmp", (tt.size, half))
        pm[:, 0] = 1.0
        np.subtract(chi[:, None], j[None, :-1], out=pm[:, 1:])
        np.add(clo[:, None] + 1.0, j[None, :-1], out=tmp[:, :-1])
        np.divide(pm[:, 1:], tmp[:, :-1], out=pm[:, 1:])
        np.cumprod(pm, axis=1, out=pm)  # (past a narrower row's window: never read by `sums`)
        self.log_scale = log_pmf(clo, tt, 0.5)
        self._check(pm, self.log_scale, tt, clo, chi)
        self._stride = half + 1
        self._sums = []
        np.multiply(pm, j[None, :], out=tmp)
        for name, x in (("s1", pm), ("sj", tmp)):
            fwd = _scratch(name, (tt.size, half + 1))
            fwd[:, 0] = 0.0
            np.cumsum(x, axis=1, out=fwd[:, 1:])
            self._sums.append(fwd.ravel())

    @staticmethod
    def _check(
        pm: FloatArray, log_scale: FloatArray, tt: FloatArray, clo: FloatArray, chi: FloatArray
    ) -> None:
        """UnsoundResult unless the products meet `log_pmf` at each row's last point."""
        last = np.minimum(clo + pm.shape[1] - 1, chi)
        got = np.log(pm[np.arange(tt.size), (last - clo).astype(np.int64)]) + log_scale
        if np.max(np.abs(got - log_pmf(last, tt, 0.5))) > RECURRENCE_TOL:
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


_LOCAL = threading.local()


def _scratch(name: str, shape: tuple[int, int]) -> FloatArray:
    """An uninitialised array of `shape`, this thread's own, reused from chunk to chunk:
    fresh arrays this large are mapped anew each time, and their page faults took half the
    time at n = 1e8-1e9 (the thread's buffers go with the thread, at the end of `add_rows`)."""
    bufs: dict[str, FloatArray] = _LOCAL.__dict__.setdefault("bufs", {})
    size = shape[0] * shape[1]
    buf = bufs.get(name)
    if buf is None or buf.size < size:
        buf = bufs[name] = np.empty(size)
    return buf[:size].reshape(shape)
