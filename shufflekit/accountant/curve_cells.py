"""A pair's exact hockey-stick curve on a loss grid, and the grid PLDs that bound it from above
(pessimistic: composing them is sound) or from below (optimistic: a post-processing of the pair,
so composing them gives a lower bound) with only a second-order discretisation error.

Write t = e^eps. A pair's curve h(t) = H_t(P || Q) = sum_l w_l (1 - t e^-l)^+ (atoms of the
privacy loss l with P-mass w_l, plus P(l = +inf)) is convex and non-increasing in t, h(0) = 1
for a proper pair, and a PLD on the grid {j * step} is exactly a convex piecewise-linear curve
with kinks at the grid points t_j = e^(j step): the P-mass at loss j step is t_j times the
slope change there (Doroshenko et al. 2022, "connect the dots"). Two facts make both bounds:

- Upper: if U_j >= h(t_j) at every grid point, the lower convex hull of (0, 1) and the points
  (t_j, U_j), constant after the last one, is >= h (between hull vertices it is a chord of
  values >= h, and a convex h lies below its chords). Its pair dominates the true one at every
  order (Blackwell), so composing it is sound, also at epsilon < 0.
- Lower: on a cell [t_j, t_j+1] a convex h is at most (t_j+1 - t_j)(slope change)/4 below its
  chord; lowering both ends of every cell by that `gap` gives points whose chords are <= h, so
  their lower convex hull (with (0, W), W = the kept mass, and max(., 0)) is <= h: a
  post-processing of the pair, whose composition is a lower bound. Its one off-grid kink (where
  it reaches 0) is rounded down, which only lowers delta. Unlike rounding every loss down (an
  error of about step per round, R * step over R rounds), both errors are second order.

`CurveCells` accumulates the atoms by cell of a fine base step (sums of w, of w e^-(l - eps_i)
and of w (1 - e^-(l - eps_i))); from these the curve at every multiple of the base step is
exact up to float round-off, by two first-order recursions of non-negative terms (no
cancellation). Float allowances: `rel_error` of the curve (relative error of the masses given)
plus 1e-12 of the mass at and above each point, and of the atoms below it whose true loss may
lie above it (`reach`: masses off by rho put a loss up to log((1 + rho) / (1 - rho)) off).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from shufflekit.accountant.numerics.grid import GridPLD
from shufflekit.base.arrays import FloatArray
from shufflekit.base.errors import AccuracyError, InvalidParameters, UnsoundResult

#: Largest number of base cells a curve may span.
MAX_CELLS = 1 << 23
WIDE_STEP = 1e-3  # the step of a curve whose span no listed step fits (`steps_that_fit`)
_ROUND = 1e-12  # relative float allowance of the recursions


@dataclass
class CurveCells:
    """Atoms of a pair summed by cell [j s, (j+1) s) of the base step s (see module docstring).

    `w`: P-mass per cell; `v`: sum of w e^-(l - j s) (Q-mass scaled by e^(j s)); `d`: sum of
    w (1 - e^-(l - j s)). `inf_mass`: P(l = +inf). `rel_error`: relative error of the masses;
    `r` (if given): sum of w times each atom's own relative error, on top of `rel_error`.
    """

    step: float
    first: int
    w: FloatArray
    v: FloatArray
    d: FloatArray
    inf_mass: float = 0.0
    rel_error: float = 0.0
    r: FloatArray | None = None
    rq: FloatArray | None = None  # with r: sum of w e^-(l - j s) times each atom's error
    max_rel: float = 0.0  # the largest of the atoms' own errors (how far a loss may be off)

    @classmethod
    def empty(cls, step: float, lo: float, hi: float, rel_error: float = 0.0) -> CurveCells:
        """Cells covering losses [lo, hi] (with one spare cell above), all zero."""
        if not (step > 0 and math.isfinite(step)):
            raise InvalidParameters(f"base step must be > 0, got {step!r}")
        first = math.floor(lo / step) - 1
        size = math.floor(hi / step) + 3 - first
        if size > MAX_CELLS:
            raise AccuracyError(
                f"a curve over losses [{lo:.4g}, {hi:.4g}] needs {size} cells of {step:g} "
                f"(limit {MAX_CELLS}); use a coarser grid"
            )
        z = np.zeros(size)
        return cls(step, first, z, z.copy(), z.copy(), 0.0, rel_error)

    def add(
        self,
        losses: npt.ArrayLike,
        log_mass: npt.ArrayLike,
        scale: float = 1.0,
        rel: FloatArray | None = None,
    ) -> None:
        """Add atoms (finite losses inside the cells, log P-masses), each mass times `scale`;
        `rel`: each atom's relative error beyond `rel_error` (kept in `r`)."""
        loss = np.asarray(losses, dtype=np.float64).ravel()
        lm = np.asarray(log_mass, dtype=np.float64).ravel()
        keep = np.isfinite(lm) & (lm > -745.0)
        loss, lm = loss[keep], lm[keep]
        own = None if rel is None else np.asarray(rel, dtype=np.float64).ravel()[keep]
        if loss.size == 0:
            return
        if not np.all(np.isfinite(loss)):
            raise InvalidParameters("curve atoms must have finite losses (use inf_mass)")
        cell = np.floor(loss / self.step).astype(np.int64)
        idx = cell - self.first
        if idx.min() < 0 or idx.max() >= self.w.size - 1:
            raise UnsoundResult("curve atom outside the cells it was sized for")
        frac = loss - cell * self.step  # in [0, step) up to round-off
        mass = np.exp(lm) * scale
        sums = [mass, mass * np.exp(-frac), mass * -np.expm1(-frac)]
        fields = [self.w, self.v, self.d]
        if own is not None:
            if self.r is None or self.rq is None:
                self.r, self.rq = np.zeros(self.w.size), np.zeros(self.w.size)
            sums += [mass * own, mass * own * np.exp(-frac)]
            fields += [self.r, self.rq]
            self.max_rel = max(self.max_rel, float(np.max(own, initial=0.0)))
        _bin_into(fields, idx, sums)

    def add_sums(self, cell: npt.NDArray[np.int64], w: FloatArray, v: FloatArray) -> None:
        """Add sums already formed per cell (absolute cell numbers; w and v as the fields), for
        atoms summed in closed form (`attack_cells`) instead of one by one. d is w - v (at
        least 0): an absolute error of the order of w's and v's own, inside the allowance."""
        idx = np.asarray(cell, dtype=np.int64).ravel() - self.first
        if idx.size == 0:
            return
        if idx.min() < 0 or idx.max() >= self.w.size - 1:
            raise UnsoundResult("curve cell outside the cells it was sized for")
        w, v = np.ravel(w), np.ravel(v)
        _bin_into([self.w, self.v, self.d], idx, [w, v, np.maximum(w - v, 0.0)])

    def reach(self) -> int:
        """Cells between an atom's computed loss and where its true one may lie (at least 1):
        masses off by rho put a loss up to log((1 + rho) / (1 - rho)) off, across many cells
        of a fine step where an atom's own error is large (1e-3 in deep tails)."""
        rho = self.rel_error + self.max_rel
        if rho >= 1.0:
            return self.w.size
        return max(1, min(self.w.size, math.ceil(math.log1p(2.0 * rho / (1.0 - rho)) / self.step)))

    def losses(self) -> FloatArray:
        """Loss at the start of every cell (the grid points)."""
        return (self.first + np.arange(self.w.size, dtype=np.float64)) * self.step

    def curve(self) -> tuple[FloatArray, FloatArray]:
        """(h, allowance) at every grid point: h(e^(j s)) without `inf_mass`, and a bound on its
        float error. h_j = d_j + X_j + Y_j with X_j = sum_{i>j} w_i (1 - e^-(i-j)s) and
        Y_j = sum_{i>j} e^-(i-j)s d_i, both by recursions of non-negative terms."""
        import scipy.signal as ssignal  # local: loading it takes ~0.5 s

        a = math.exp(-self.step)
        one_minus_a = -math.expm1(-self.step)
        w, d = self.w, self.d
        suffix = np.concatenate([np.cumsum(w[::-1])[::-1][1:], [0.0]])  # S_j = sum_{i>j} w_i
        # X_j = a X_{j+1} + (1 - a) S_j ;  Y_j = a (d_{j+1} + Y_{j+1})
        x = ssignal.lfilter([1.0], [1.0, -a], (one_minus_a * suffix)[::-1])[::-1]
        d_next = np.concatenate([d[1:], [0.0]])
        y = ssignal.lfilter([a], [1.0, -a], d_next[::-1])[::-1]
        h = np.maximum(d + np.asarray(x) + np.asarray(y), 0.0)
        back = self.reach()
        # the mass at and above, and `back` cells below: an atom there may truly lie above
        allow = (2.0 * self.rel_error + _ROUND) * _from_back(w, back) + 1e-300
        if self.r is not None:  # the atoms' own errors, likewise
            allow = allow + 2.0 * _from_back(self.r, back)
        return h, allow

    def curve_at(self, step: float, first: int, size: int) -> tuple[FloatArray, FloatArray]:
        """(h, allowance) as `curve` gives them, at the points j step, j = first .. first +
        size - 1, of a grid whose step is a multiple of the base step, wherever they lie: below
        the cells every atom is above the point, so h = P - t Q exactly (P, Q: all the mass);
        above them h = 0."""
        r = coarse(self.step, step)
        h_in, allow_in = self.curve()
        idx = (first + np.arange(size, dtype=np.int64)) * r - self.first
        inside = (idx >= 0) & (idx < self.w.size)
        h, allow = np.zeros(size), np.zeros(size)
        h[inside], allow[inside] = h_in[idx[inside]], allow_in[idx[inside]]
        below = idx < 0
        if np.any(below):
            mass = float(np.sum(self.w))
            q_mass = float(
                np.sum(self.v * np.exp(-(self.first + np.arange(self.v.size)) * self.step))
            )
            t = np.exp((first + np.flatnonzero(below)) * step)
            h[below] = np.maximum(mass - t * q_mass, 0.0)
            own = 0.0 if self.r is None else 2.0 * float(np.sum(self.r))
            allow[below] = (2.0 * self.rel_error + _ROUND) * mass + own + 1e-300
        return h, allow

    def curve_below(self) -> tuple[FloatArray, FloatArray]:
        """(g, allowance) at every grid point j: g_j = sum over the atoms below t_j = e^(j s) of
        t_j Q - P = w (e^(j s - l) - 1), so that a proper pair (P and Q of total mass 1) has
        h(t_j) = (1 - t_j) + g_j. Below t = 1 this is far more accurate than `curve`, whose
        allowance is relative to all the mass above (~1) while h - (1 - t) is tiny there.
        With u_i = sum over cell i of w (e^((i+1) s - l) - 1) = (e^s - 1) w_i - e^s d_i:
        g_j = A_j + B_j, A_j+1 = e^s A_j + u_j, B_j+1 = e^s B_j + (e^s - 1) W_j (W_j: mass
        below j), recursions of non-negative terms. Allowance: the masses' errors on t_j Q +
        P below (= g_j + 2 W_j) and in cell j (an atom there may truly lie below), 1e-10 of g
        for the recursions, and the rounding of u."""
        import scipy.signal as ssignal  # local: loading it takes ~0.5 s

        es, em1 = math.exp(self.step), math.expm1(self.step)
        w, d = self.w, self.d
        u = np.maximum(em1 * w - es * d, 0.0)
        below = np.concatenate([[0.0], np.cumsum(w)[:-1]])  # W_j
        a = ssignal.lfilter([0.0, 1.0], [1.0, -es], u)  # A_j = sum_{i<j} e^((j-1-i) s) u_i
        b = ssignal.lfilter([0.0, em1], [1.0, -es], below)  # B_j: same on (e^s - 1) W
        g = np.asarray(a) + np.asarray(b)
        allow = self.rel_error * (g + 2.0 * below) + 1e-10 * g + 1e-14 * em1 * below + 1e-300
        # an atom of cell j whose computed loss is at or above j s but whose true loss is below
        allow = allow + (2.0 * self.rel_error + _ROUND) * w
        if self.r is not None and self.rq is not None:
            r_below = np.concatenate([[0.0], np.cumsum(self.r)[:-1]])
            rq_t = ssignal.lfilter([0.0, es], [1.0, -es], self.rq)  # sum_{i<j} e^((j-i) s) rq_i
            allow = allow + r_below + np.asarray(rq_t) + 2.0 * self.r
        return g, allow

    def gaps(self) -> FloatArray:
        """Per cell j: (t_j+1 - t_j)(slope change of h inside the cell)/4, the most a convex
        curve falls below its chord on the cell."""
        return math.expm1(self.step) / 4.0 * self.v


class AtomsCurve:
    """The curve of a set of atoms (finite losses, log P-masses with relative error
    `rel_error` plus each one's own `rel`) at any losses, in closed form: h(e^s) = A(s) -
    e^s B(s), A and B the P- and Q-mass of the atoms above s (suffix sums after one sort).
    Without cells a point costs O(log atoms), not a pass over every cell of the span: the
    curve of a few dozen atoms on a fine grid over [-eps0, eps0] (large eps0) is a gather.
    Between two consecutive atoms h is linear in t = e^s.

    Allowance: 2 rho w for every atom whose true term can differ from the computed one (those
    above s, and those below within log((1 + rho) / (1 - rho)), rho its whole relative error:
    (.)^+ is 1-Lipschitz; `reach`: where each atom stops counting), plus twice the suffix
    sums' round-off, (4 N eps + _ROUND) of the mass there: once for h here, once more for h at
    any larger s (the allowance does not increase with s, so it covers the round-off of
    values interpolated from the next point up too)."""

    def __init__(
        self,
        losses: FloatArray,
        log_mass: FloatArray,
        rel_error: float,
        rel: FloatArray | None = None,
    ) -> None:
        order = np.argsort(losses, kind="stable")  # (k = 2 leaves come sorted: linear)
        self.loss = np.asarray(losses, dtype=np.float64)[order]
        mass = np.exp(np.asarray(log_mass, dtype=np.float64)[order])
        own = np.zeros(mass.size) if rel is None else np.asarray(rel, dtype=np.float64)[order]
        self._a = _suffix(mass)  # _a[j]: P-mass of atoms j.. (one 0 at the end)
        self._b = _suffix(mass * np.exp(-self.loss))  # and their Q-mass
        rho = rel_error + own
        with np.errstate(divide="ignore"):
            reach = self.loss + np.where(rho < 1.0, np.log1p(2.0 * rho / (1.0 - rho)), np.inf)
        by_reach = np.argsort(reach, kind="stable")
        self.reach = reach[by_reach]
        round_off = 4.0 * mass.size * np.finfo(np.float64).eps + _ROUND
        self._allow = 2.0 * (_suffix((rho * mass)[by_reach]) + round_off * _suffix(mass[by_reach]))

    def at(self, points: FloatArray, t: FloatArray | None = None) -> tuple[FloatArray, FloatArray]:
        """(h, allowance) at the losses `points` (`t`: their exponentials, if at hand)."""
        s = np.asarray(points, dtype=np.float64)
        above = np.searchsorted(self.loss, s, side="right")  # first atom above s
        t = np.exp(s) if t is None else t
        h = np.maximum(self._a[above] - t * self._b[above], 0.0)
        return h, self._allow[np.searchsorted(self.reach, s, side="right")] + 1e-300


def _from_back(x: FloatArray, back: int) -> FloatArray:
    """Entry j: sum of x[j - back:] (every cell from `back` below j up)."""
    total = np.concatenate([np.cumsum(x[::-1])[::-1], [0.0]])  # total[j]: sum of x[j:]
    return total[np.maximum(np.arange(x.size) - back, 0)]


def _suffix(x: FloatArray) -> FloatArray:
    """Suffix sums of x (entry j: sum of x[j:]), and a 0 after the last."""
    return np.concatenate([np.cumsum(x[::-1])[::-1], [0.0]])


def _bin_into(fields: list[FloatArray], idx: npt.NDArray[np.int64], sums: list[FloatArray]) -> None:
    """fields[i][idx] += sums[i], summing repeated indices; bins only the span idx covers (the
    cells may be many: millions at fine steps, against thousands of indices per call)."""
    lo = int(idx.min())
    local = idx - lo
    size = int(local.max()) + 1
    for acc, add in zip(fields, sums, strict=True):
        acc[lo : lo + size] += np.bincount(local, weights=add, minlength=size)


def merge_max(curves: list[tuple[FloatArray, FloatArray]]) -> FloatArray:
    """Pointwise max of (h + allowance) over curves on the same cells: an upper bound of each."""
    return np.asarray(np.max(np.stack([h + a for h, a in curves]), axis=0), dtype=np.float64)


def steps_that_fit(
    steps: Sequence[float], span: float, max_cells: float, wide: float = WIDE_STEP
) -> list[float]:
    """The `steps` whose cells over [-span, span] number at most `max_cells` (in order), or
    [wide] if none does: the one test of how fine a curve of losses within +-span may be."""
    return [s for s in steps if 2 * span / s <= max_cells] or [wide]


def coarse(cells_step: float, step: float) -> int:
    """How many base cells one cell of `step` spans; AccuracyError unless an integer."""
    r = step / cells_step
    k = round(r)
    if k < 1 or abs(r - k) > 1e-9 * r:
        raise AccuracyError(
            f"grid step {step:g} is not a multiple of the curve's base step {cells_step:g}"
        )
    return int(k)


def _lower_hull(x: FloatArray, y: FloatArray) -> npt.NDArray[np.int64]:
    """Indices of the vertices of the lower convex hull of points with increasing x."""
    idx = np.arange(x.size)
    for _ in range(64):  # vectorised passes: drop every point above its neighbours' chord
        if idx.size < 3:
            return idx
        xs, ys = x[idx], y[idx]
        dx1, dx2 = xs[1:-1] - xs[:-2], xs[2:] - xs[1:-1]
        dy1, dy2 = ys[1:-1] - ys[:-2], ys[2:] - ys[1:-1]
        above = dy1 * dx2 > dy2 * dx1  # slope decreases at the middle point
        dropped = int(np.count_nonzero(above))
        if dropped == 0:
            return idx
        idx = idx[np.concatenate([[True], ~above, [True]])]
        if dropped * 64 < idx.size:  # passes that drop so few are a cascade: split chords
            break
    return _quickhull_lower(x, y, idx)


def _quickhull_lower(
    x: FloatArray, y: FloatArray, idx: npt.NDArray[np.int64]
) -> npt.NDArray[np.int64]:
    """The lower hull's vertices among `idx` (increasing x), for what the passes leave: split
    at the point farthest below each chord until none is below. A chord's points are one array
    operation, so a long run that the passes shorten by one point each (a plateau ending in a
    drop: 2 million points at eps0 = 60) takes a few operations, not a Python loop per point.
    The chords of one depth are disjoint: they are split together, in one array operation per
    depth, not one per chord (a hull of 1e5 vertices took 1e5 small steps, 1-2 s, in each
    composition of `calibrate_eps0`). Each chord makes the same decision as on its own (the
    same area arithmetic, the first of equal minima), so the vertices are the same."""
    keep = np.zeros(idx.size, dtype=bool)
    keep[[0, -1]] = True
    a, b = np.array([0]), np.array([idx.size - 1])
    while True:
        wide = b - a >= 2
        a, b = a[wide], b[wide]
        if a.size == 0:
            return idx[keep]
        sizes = b - a - 1
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        chord = np.repeat(np.arange(a.size), sizes)
        pos = np.arange(chord.size) - starts[chord] + a[chord] + 1
        ia, ib, inner = idx[a][chord], idx[b][chord], idx[pos]
        area = (x[ib] - x[ia]) * (y[inner] - y[ia]) - (y[ib] - y[ia]) * (x[inner] - x[ia])
        if np.isnan(area).any():  # argmin picks a NaN: keep its exact behaviour, chord by chord
            return _quickhull_chords(
                x, y, idx, keep, list(zip(a.tolist(), b.tolist(), strict=True))
            )
        low = np.minimum.reduceat(area, starts)
        first = np.flatnonzero(area == low[chord])
        first = first[np.concatenate([[True], chord[first][1:] != chord[first][:-1]])]
        below = low < 0
        m = pos[first][below]
        keep[m] = True
        a, b = np.concatenate([a[below], m]), np.concatenate([m, b[below]])


def _quickhull_chords(
    x: FloatArray,
    y: FloatArray,
    idx: npt.NDArray[np.int64],
    keep: npt.NDArray[np.bool_],
    stack: list[tuple[int, int]],
) -> npt.NDArray[np.int64]:
    """`_quickhull_lower` one chord at a time, from the chords in `stack`."""
    while stack:
        a, b = stack.pop()
        if b - a < 2:
            continue
        ia, ib, inner = idx[a], idx[b], idx[a + 1 : b]
        area = (x[ib] - x[ia]) * (y[inner] - y[ia]) - (y[ib] - y[ia]) * (x[inner] - x[ia])
        j = int(np.argmin(area))
        if not area[j] < 0:  # nothing strictly below the chord
            continue
        m = a + 1 + j
        keep[m] = True
        stack += [(a, m), (m, b)]
    return idx[keep]


def _masses(t: FloatArray, vals: FloatArray, h0: float) -> tuple[FloatArray, FloatArray]:
    """P-masses at the kinks of the convex piecewise-linear curve through (0, h0) and
    (t_i, vals_i) (hull vertices, increasing t), constant after the last: t_i * slope change."""
    xs = np.concatenate([[0.0], t])
    ys = np.concatenate([[h0], vals])
    slopes = np.diff(ys) / np.diff(xs)
    right = np.concatenate([slopes[1:], [0.0]])
    return t, np.maximum(t * (right - slopes), 0.0)


def upper_grid(
    step: float, first: int, upper_vals: FloatArray, inf_mass: float, key: str
) -> GridPLD:
    """A dominating grid PLD from upper bounds `upper_vals[i]` >= h(e^((first+i) step)) (inf
    mass included) of a proper pair: the lower convex hull of (0, 1) and those points.

    The hull is constant after the last point: its +inf mass is the last value, of which what
    exceeds the pair's own `inf_mass` is looseness (`truncated_mass`, which the accuracy check
    counts as slack); the pair's own infinite mass is part of its delta, as for any PLD."""
    u = np.maximum.accumulate(np.asarray(upper_vals, dtype=np.float64)[::-1])[::-1]
    u = np.minimum(u, 1.0)
    if u[-1] < inf_mass:
        raise UnsoundResult("upper curve below its own infinite mass")
    t = np.exp((first + np.arange(u.size)) * step)
    x = np.concatenate([[0.0], t])
    y = np.concatenate([[1.0], u])
    hv = _lower_hull(x, y)[1:] - 1  # vertices among the grid points
    _tv, mv = _masses(t[hv], u[hv], 1.0)
    probs = np.zeros(u.size)
    probs[hv] = mv
    last = float(u[-1])
    return GridPLD(
        step=step,
        offset=first,
        probs=probs,
        inf_mass=last,
        log_inf_mass=math.log(last) if last > 0 else -math.inf,
        upper=True,
        truncated_mass=max(last - inf_mass, 0.0),
        method="hull",
        key=key,
    )


def lower_grid(cells: CurveCells, step: float, key: str, proper: bool = False) -> GridPLD:
    """A grid PLD (step a multiple of the base step) whose curve is <= the pair's: composing it
    gives a lower bound (see the module docstring; the pair's infinite mass is dropped).
    `proper`: the cells hold (part of) a pair whose P and Q have total mass 1, so below t = 1
    the curve is at least (1 - t) + g (`CurveCells.curve_below`: far tighter there)."""
    r = coarse(cells.step, step)
    pad_lo = cells.first % r  # base cells prepended so that the first is a coarse point
    n_base = pad_lo + cells.w.size
    pad_hi = (-n_base) % r + r  # and a whole empty coarse cell at the end
    z_lo, z_hi = np.zeros(pad_lo), np.zeros(pad_hi)
    al = CurveCells(
        cells.step,
        cells.first - pad_lo,
        np.concatenate([z_lo, cells.w, z_hi]),
        np.concatenate([z_lo, cells.v, z_hi]),
        np.concatenate([z_lo, cells.d, z_hi]),
        0.0,
        cells.rel_error,
        None if cells.r is None else np.concatenate([z_lo, cells.r, z_hi]),
        None if cells.rq is None else np.concatenate([z_lo, cells.rq, z_hi]),
        cells.max_rel,
    )
    j0 = al.first // r
    h, allow = al.curve()
    pts = np.arange(0, h.size, r)
    hc = h[pts] * (1.0 - 2.0 * al.rel_error) - allow[pts]
    if proper:  # atoms left out only add to g, and the true totals are 1
        g, allow_g = al.curve_below()
        t_pts = np.exp((j0 + np.arange(pts.size)) * step)
        from_below = (1.0 - t_pts) + g[pts] - allow_g[pts]
        hc = np.where(t_pts < 1.0, np.maximum(hc, from_below), hc)
    # Q-mass of coarse cell J scaled by e^(J step): base cells J r .. J r + r - 1
    scaled = al.v * np.exp(-(np.arange(al.v.size) % r) * al.step)
    v_coarse = np.add.reduceat(scaled, pts)
    gap = math.expm1(step) / 4.0 * v_coarse * (1.0 + 1e-9)
    lowered = hc - np.maximum(gap, np.concatenate([[0.0], gap[:-1]]))
    total = float(np.sum(al.w)) * (1.0 - 2.0 * al.rel_error - _ROUND)
    total -= 0.0 if al.r is None else 2.0 * float(np.sum(al.r))
    t = np.exp((j0 + np.arange(pts.size)) * step)
    x = np.concatenate([[0.0], t])
    y = np.concatenate([[total], lowered])
    hv = _lower_hull(x, y)
    vx, vy = x[hv], y[hv]
    probs = np.zeros(pts.size)
    if total > 0:
        c = int(np.argmax(vy <= 0.0))  # first vertex at or below 0 (the last one is)
        if c < 1 or vy[c] > 0.0:
            raise UnsoundResult("lower hull does not reach 0 at its last point")
        seg = np.diff(vy[: c + 1]) / np.diff(vx[: c + 1])  # seg[k]: vertex k -> k+1
        inner = np.arange(1, c)  # kinks at vertices 1 .. c-1
        idx = hv[inner] - 1
        probs[idx] = np.maximum(vx[inner] * (seg[inner] - seg[inner - 1]), 0.0)
        s = float(seg[c - 1])
        x_star = float(vx[c - 1] - vy[c - 1] / s)  # where the hull reaches 0: rounded down
        j_star = math.floor(math.log(x_star) / step) - j0
        if c > 1:  # vertex c-1 is a grid point below x_star (max: float rounding of the log)
            j_star = max(j_star, int(hv[c - 1]) - 1)
        if j_star >= 0:  # else below the grid: dropped (a lower bound may drop mass)
            probs[min(j_star, probs.size - 1)] += x_star * -s
    return GridPLD(
        step=step,
        offset=j0,
        probs=probs,
        inf_mass=0.0,
        log_inf_mass=-math.inf,
        upper=False,
        truncated_mass=0.0,
        method="hull-lower",
        key=key,
    )
