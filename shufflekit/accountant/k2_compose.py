"""k = 2 across rounds: a dominating pair built from the certified k = 2 analysis (tight_k2), so
that composing binary rounds is as tight as one round is, instead of composing the looser
blanket pair.

For k = 2 every neighbouring pair is "m others at x0, the rest at x1, target x0 vs x1" for some
m in 0..n-1 (the reverse order at m is the order x0|x1 at n-1-m). As in `tight_k2`, the m axis
is cut into intervals ("leaves"); a leaf [m1, m2] with w = m2 - m1 > 0 is covered by ONE
explicit pair: reveal which of its w middle users took k-RR's uniform branch (b of them), which
leaves A1 + B1 + Bin(b, 1/2) + target, A1 ~ Bin(m1, p), B1 ~ Bin(n-1-m2, q). Every m of the leaf
is a post-processing of that view, at every order (epsilon of either sign). Larger b is a
post-processing of smaller b, so the pair at b_min (with P(b >= b_min)) plus the target's own
randomized response (with P(b < b_min), it dominates everything) dominates the leaf. A leaf
with w = 0 is the exact pair of that dataset.

So sup over datasets of H_t <= max over leaves of the leaves' curves, at every t, exactly. The
leaves are refined (split) until, on a check grid, no wide leaf exceeds (1 + rtol) times the
best exact dataset (plus a floor of 1e-22). `K2Pair.upper_values(step)` gives the max curve on a
composition grid (with float allowances) and `curve_cells.upper_grid` turns it into a
dominating PLD on that grid. Leaves' curves come from their atoms in closed form
(`curve_cells.AtomsCurve`); where the leaves hold fewer atoms than the grid has points (large
eps0: a few dozen atoms a leaf, a grid of 4e5 points over [-eps0, eps0]) the max is taken at
the atoms only and interpolated exactly between them (`_envelope`): 3 rounds at n = 1e4,
eps0 = 10 went from 27 s to 5 s. `K2Pair.worst_atoms()` is the exact PLD of the best single dataset
(for the composed lower bound).

Numerics as in `tight_k2`: pmfs from log-space binomials scaled by their maxima, summed by
`numerics.pmf_sum` (directly, or by tilted FFTs with each entry's certified relative error kept
per atom and allowed for by `CurveCells`; 1e-9 more per mass); windows cut at e^-57 per
binomial and sums certified down to e^-54 of uncertified mass, what is left out added at +inf
loss (upper side only; far below FLOOR). The refinement checks run on
a loss grid of a round's spread / 8 (at n = 1e7 a round's losses spread ~1e-4), over the
losses that carry mass; leaves are built on threads. Above ATOMS_MAX_N = 1e7 users a wide
leaf keeps its atoms summed into cells of the round's base step (`_cells_of`: its curve at
every multiple of that step is exact, and the lightest 1e-25 of mass at either end is moved
outward, which only raises it): ~1,000 cells instead of ~10^5-10^6 atoms a leaf, so a pair at
n = 1e9 holds ~60 MB instead of GBs. Measured (delta = 1e-6, cold, eps0 = 4 and 1): 8-39 s at
n = 1e7, 8-28 s at 1e8 and 22-87 s at 1e9, almost all of it building the leaves (~0.5 s each
at 1e9); composed gaps 0.35-0.84% for 1 to 1,000 rounds.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from shufflekit.accountant.core import Mechanism
from shufflekit.accountant.curve_cells import MAX_CELLS, AtomsCurve, CurveCells, steps_that_fit
from shufflekit.accountant.numerics.binomial import log_cdf, tail_window_int
from shufflekit.accountant.numerics.krr import krr
from shufflekit.accountant.numerics.pmf_sum import binomial_piece, pmf_sum
from shufflekit.accountant.tight_k2 import default_cuts, on_threads, split_interval
from shufflekit.base.arrays import FloatArray
from shufflekit.base.errors import InvalidParameters

_REL = 1e-9  # relative error allowed for each mass (log-space pmfs + direct convolution)
_LOG_TAU = -57.0  # binomial windows (what they leave out goes to +inf: far below FLOOR)
_LOG_OUT = -54.0  # mass the FFT sums may leave uncertified (to +inf too: 3.5e-24 < FLOOR)
_LOG_B_TAU = -55.0  # lower tail of the number of revealed uniform reports in a leaf
FLOOR = 1e-22  # curve values below this do not drive the refinement
CHECK_STEP = 1e-3  # loss grid of the refinement checks (finer where losses spread less)
MAX_N = 1_000_000_000  # every n `tight` answers
#: Above this n wide leaves keep their atoms summed into cells of CELL_STEPS (their curves on
#: every multiple of the cell step are exact; ~1,000 cells instead of ~10^5 atoms a leaf).
ATOMS_MAX_N = 10_000_000
CELLS_RTOL = 0.03  # the refinement's tolerance there (composed gaps barely differ from 1%)
#: Base steps of the k = 2 curves: the largest that is at most a round's loss spread / 8, of
#: those whose curve over [-eps0, eps0] fits in half of MAX_CELLS (`steps_that_fit`).
CELL_STEPS = (5e-5, 5e-6, 5e-7)
CELL_TAIL = 1e-25  # mass a leaf may move out of its cells at each end (see `leaf`)


@dataclass
class Leaf:
    """One interval [m1, m2] of m and its pair: finite atoms, +inf mass, RR weight."""

    m1: int
    m2: int
    losses: FloatArray
    log_mass: FloatArray
    inf_mass: float
    rr_weight: float  # P(b < b_min): weight of the target's randomized response pair
    rels: FloatArray | None = None  # each mass's relative error from the convolution (+ _REL)
    cells: CurveCells | None = None  # the atoms in cells, for the upper curves (see `leaf`)

    @property
    def exact(self) -> bool:
        """A single dataset (not an interval): its pair is exact."""
        return self.m1 == self.m2

    def loss_range(self, min_log_mass: float = -math.inf) -> tuple[float, float] | None:
        """Smallest and largest loss of the atoms (cells) of mass above e^min_log_mass."""
        if self.cells is not None:
            heavy = np.flatnonzero(self.cells.w > math.exp(max(min_log_mass, -745.0)))
            if heavy.size == 0:
                return None
            step, first = self.cells.step, self.cells.first
            return (first + int(heavy[0])) * step, (first + int(heavy[-1]) + 1) * step
        x = self.losses[self.log_mass > min_log_mass] if min_log_mass > -math.inf else self.losses
        return (float(x.min()), float(x.max())) if x.size else None

    def add_cells(self, step: float) -> None:
        """Sum the atoms into cells of `step` (`_cells_of`) for the upper curves."""
        if self.cells is None and self.losses.size:
            self.cells, moved = _cells_of(self.losses, self.log_mass, self.rels, step)
            self.inf_mass += moved

    @property
    def nbytes(self) -> int:
        """Memory held by the atoms and cells."""
        arrays = [self.losses, self.log_mass, self.rels]
        if self.cells is not None:
            c = self.cells
            arrays += [c.w, c.v, c.d, c.r, c.rq]
        return sum(int(a.nbytes) for a in arrays if a is not None)


def leaf(mech: Mechanism, m1: int, m2: int, cell_step: float | None = None) -> Leaf:
    """The dominating pair of the datasets m in [m1, m2] (see the module docstring); with
    `cell_step`, a wide leaf's atoms are kept summed into cells of that step."""
    rr = krr(2, mech.eps0)
    p, q, gamma = rr.p, rr.q, rr.gamma
    n1 = mech.n - 1
    w = m2 - m1
    rr_weight, b_min = 0.0, 0
    if w > 0:
        b_min = tail_window_int(w, gamma, _LOG_B_TAU)[0]
        if b_min > 0:
            rr_weight = math.exp(float(log_cdf(b_min - 1, w, gamma, "upper")))
    total = pmf_sum(
        [
            binomial_piece(m1, p, _LOG_TAU),
            binomial_piece(n1 - m2, q, _LOG_TAU),
            binomial_piece(b_min, 0.5, _LOG_TAU),
        ],
        log_out_target=_LOG_OUT,
    )
    c, log_scale, dropped = total.vals, total.log_scale, math.exp(total.log_out)
    cm1, c0, own = total.neighbours()  # C(s-1), C(s) and their larger relative error
    px0 = p * cm1 + q * c0
    px1 = q * cm1 + p * c0
    ok = (px0 > 0) & (px1 > 0)
    with np.errstate(divide="ignore"):
        losses = np.log(px0[ok]) - np.log(px1[ok])
        log_mass = np.log(px0[ok]) + log_scale + math.log1p(-rr_weight)
    # underflowed entries (scaled values below ~1e-300) and P-only entries: at +inf loss
    under = 1e-280 * c.size * math.exp(min(log_scale, 700.0))
    only_p = float(np.sum(px0[(px0 > 0) & ~(px1 > 0)])) * math.exp(min(log_scale, 700.0))
    rels = own[ok]
    inf_mass = (dropped + under + only_p) * (1.0 + _REL + total.max_rel)
    lf = Leaf(m1, m2, losses, log_mass, inf_mass, rr_weight, rels)
    if cell_step is not None:
        lf.add_cells(cell_step)
        if not lf.exact:  # (exact leaves keep their atoms too: the attack composes them)
            lf.losses = lf.log_mass = np.zeros(0)
            lf.rels = None
    return lf


def _cells_of(
    losses: FloatArray, log_mass: FloatArray, rels: FloatArray | None, step: float
) -> tuple[CurveCells, float]:
    """The atoms summed into cells of `step` where the mass is (the windows' edges reach
    losses near +-eps0), and the mass moved out: the lightest atoms above, CELL_TAIL of mass in
    all, go to +inf, those below up to the lowest loss kept; both only raise the curve (by at
    most CELL_TAIL, far below FLOOR)."""
    own = np.zeros(losses.size) if rels is None else rels
    order = np.argsort(losses, kind="stable")
    mass = np.exp(log_mass[order])
    top = np.cumsum(mass[::-1])[::-1]  # mass at and above each atom
    bottom = np.cumsum(mass)  # mass at and below each atom
    hi_i = int(np.searchsorted(-top, -CELL_TAIL, side="right")) - 1  # last with top >= tail
    lo_i = int(np.searchsorted(bottom, CELL_TAIL, side="left"))  # first with bottom >= tail
    moved = 0.0
    if 0 <= lo_i <= hi_i < losses.size:
        lo, hi = float(losses[order[lo_i]]), float(losses[order[hi_i]])
        above = losses > hi
        if np.any(above):
            worst = 1.0 + _REL + float(np.max(own[above]))
            moved = float(np.sum(np.exp(log_mass[above]))) * worst
        keep = ~above
        losses, log_mass, own = np.maximum(losses[keep], lo), log_mass[keep], own[keep]
    cells = CurveCells.empty(step, float(losses.min()), float(losses.max()), rel_error=_REL)
    cells.add(losses, log_mass, rel=own)
    return cells, moved


def _rr_curve(mech: Mechanism, eps: FloatArray) -> FloatArray:
    """Hockey-stick curve of the target's randomized response alone (binary, eps0)."""
    rr = krr(2, mech.eps0)
    t = np.exp(eps)
    return np.asarray(
        np.maximum(rr.p - t * rr.q, 0.0) + np.maximum(rr.q - t * rr.p, 0.0), dtype=np.float64
    )


@dataclass
class K2Pair:
    """The leaves of one k = 2 mechanism and the curves they give (see module docstring)."""

    mech: Mechanism
    rtol: float = 1e-2
    max_leaves: int = 600
    leaves: list[Leaf] = field(default_factory=list)
    converged: bool = False
    check_step: float = CHECK_STEP
    cell_step: float | None = None  # wide leaves' cells (n > ATOMS_MAX_N), else atoms

    def __post_init__(self) -> None:
        if self.mech.k != 2:
            raise InvalidParameters(f"the k = 2 pair needs k = 2, got k = {self.mech.k}")
        if self.mech.n > MAX_N:
            raise InvalidParameters(f"the k = 2 pair is built for n <= {MAX_N:,}")
        spans = [(a, b - 1) for a, b in itertools.pairwise(default_cuts(self.mech.n))]
        if self.mech.n > ATOMS_MAX_N:  # the exact datasets first: their spread sets the cells
            self.leaves = self._leaves([ab for ab in spans if ab[0] == ab[1]])
            self.cell_step = self.base_step()
            for lf in self.leaves:
                lf.add_cells(self.cell_step)
            self.leaves += self._leaves([ab for ab in spans if ab[0] < ab[1]])
            self.leaves.sort(key=lambda lf: lf.m1)
            self.check_step = self.cell_step  # (the cells' curves exist at its multiples only)
        else:
            self.leaves = self._leaves(spans)
            # the checks must resolve a round's spread of losses (sd / 8, a power of two below)
            # and fit their grid over [-eps0, eps0] in MAX_CELLS / 2 (eps0 ~ 38: 2^-16)
            fit = 2.0 ** math.ceil(math.log2(4 * self.mech.eps0 / MAX_CELLS))
            sd_step = 2.0 ** math.floor(math.log2(self.loss_sd() / 8))
            self.check_step = min(CHECK_STEP, max(sd_step, fit))
        self._refine()

    def base_step(self) -> float:
        """The largest of CELL_STEPS within a round's loss spread / 8 (the smallest if none);
        the cells' step where wide leaves keep cells."""
        if self.cell_step is not None:
            return self.cell_step
        sd = self.loss_sd()
        fits = steps_that_fit(CELL_STEPS, self.mech.eps0, MAX_CELLS // 2)
        return next((s for s in fits if s <= sd / 8), fits[-1])

    def _range(self, min_log_mass: float = -math.inf) -> tuple[float, float]:
        ranges = [r for lf in self.leaves if (r := lf.loss_range(min_log_mass)) is not None]
        if not ranges:
            return 0.0, 0.0
        return min(r[0] for r in ranges), max(r[1] for r in ranges)

    def _leaves(self, spans: list[tuple[int, int]]) -> list[Leaf]:
        """The leaves of `spans` ([m1, m2] each), built on up to WORKERS threads (the
        transforms and convolutions release the GIL)."""
        step = self.cell_step
        return on_threads(lambda ab: leaf(self.mech, *ab, cell_step=step), spans, len(spans) >= 4)

    def _check_range(self) -> tuple[float, float]:
        """The losses of every atom of mass above e^-69 (~1e-30), with a margin: beyond them
        the curves are far below FLOOR, so the refinement checks need not look there."""
        if all(lf.loss_range(-69.0) is None for lf in self.leaves):
            return -self.mech.eps0, self.mech.eps0
        lo, hi = self._range(-69.0)
        pad = 0.1 * (hi - lo) + 2 * self.check_step
        return max(lo - pad, -self.mech.eps0), min(hi + pad, self.mech.eps0)

    def _curve(
        self, lf: Leaf, step: float, lo: float, hi: float
    ) -> tuple[FloatArray, FloatArray, FloatArray]:
        """(h + allowance, h - allowance, allowance) of a leaf at the grid points of `step` over
        [lo, hi] (+inf mass and RR part included; the lower value is for exact leaves): from
        its atoms in closed form (`atoms_curve`), or where it keeps cells, their exact curve
        (at multiples of its cell step only)."""
        grid = CommonGrid(step, lo, hi)
        losses = grid.losses()
        if lf.cells is not None:
            h, allow = lf.cells.curve_at(step, grid.first, losses.size)
        else:
            h, allow = AtomsCurve(lf.losses, lf.log_mass, _REL, lf.rels).at(losses)
        rr = lf.rr_weight * _rr_curve(self.mech, losses) if lf.rr_weight > 0 else 0.0
        return h + allow + lf.inf_mass + rr * (1.0 + _REL), h - allow, allow

    def _refine(self) -> None:
        """Split wide leaves that exceed (1 + rtol) x the best exact dataset on the check grid
        (differences within the float allowances do not count)."""
        lo, hi = self._check_range()
        t = np.exp(CommonGrid(self.check_step, lo, hi).losses())
        base = np.maximum(1.0 - t, 0.0)  # every pair has h >= (1 - t)^+: compare the rest
        cache: dict[tuple[int, int], tuple[FloatArray, FloatArray, FloatArray]] = {}
        while True:
            for lf in self.leaves:
                if (lf.m1, lf.m2) not in cache:
                    cache[(lf.m1, lf.m2)] = self._curve(lf, self.check_step, lo, hi)
            curves = [cache[(lf.m1, lf.m2)] for lf in self.leaves]
            exact = [c[1] - base for lf, c in zip(self.leaves, curves, strict=True) if lf.exact]
            best = np.max(np.stack(exact), axis=0) if exact else np.zeros_like(t)
            limit = (1.0 + self.rtol) * np.maximum(best, 0.0) + FLOOR
            parts: dict[int, list[tuple[int, int]]] = {}
            for i, (lf, c) in enumerate(zip(self.leaves, curves, strict=True)):
                over = c[0] - base - 4.0 * c[2]
                if not lf.exact and bool(np.any(over > limit)):
                    excess = float(np.max(over / limit))  # > 1: the worst point's ratio
                    # (at most 4 parts: far out the ratio to a tiny curve says little)
                    parts[i] = split_interval(
                        lf.m1, lf.m2, math.log(excess), math.log1p(self.rtol), max_parts=4
                    )
            if not parts:
                self.converged = True
                return
            if len(self.leaves) + sum(len(p) - 1 for p in parts.values()) > self.max_leaves:
                parts = {i: split_interval(self.leaves[i].m1, self.leaves[i].m2) for i in parts}
            if len(self.leaves) + len(parts) > self.max_leaves:
                return  # still sound, only looser
            built = iter(self._leaves([span for i in sorted(parts) for span in parts[i]]))
            new: list[Leaf] = []
            for i, lf in enumerate(self.leaves):
                new += [next(built) for _ in parts[i]] if i in parts else [lf]
            self.leaves = new

    def upper_values(
        self, step: float, leaves: Sequence[Leaf] | None = None
    ) -> tuple[int, FloatArray]:
        """(first grid index, upper bound of the max over `leaves` (default: all, i.e. sup over
        datasets) of H at e^(j step)) on the grid of `step` covering every leaf's losses (above
        them: the +inf and RR parts only). The grid is the same whatever `leaves` is."""
        lo, hi = self._range()
        lo, hi = max(lo, -self.mech.eps0), min(hi, self.mech.eps0)
        chosen = self.leaves if leaves is None else leaves
        grid = CommonGrid(step, lo, hi)
        s = grid.losses()
        atoms = sum(lf.losses.size for lf in chosen)
        if all(lf.cells is None for lf in chosen):  # atoms: few (large eps0) or many
            if 2 * atoms <= s.size:
                return grid.first, np.minimum(self._envelope(chosen, s), 1.0)
            return self.cells_upper_values(step, chosen)
        up = self._curve(chosen[0], step, lo, hi)[0]
        for lf in chosen[1:]:
            np.maximum(up, self._curve(lf, step, lo, hi)[0], out=up)
        return grid.first, np.minimum(up, 1.0)

    def cells_upper_values(
        self, step: float, leaves: Sequence[Leaf] | None = None
    ) -> tuple[int, FloatArray]:
        """`upper_values(step, leaves)` as the max of every leaf's curve from its atoms summed
        into cells of `step` over the whole grid: O(atoms + grid) a leaf, the way where leaves
        hold more atoms than the grid has points (n ~ 1e7), and the reference tests and
        benchmarks measure `_envelope` against (it replaced this pass at large eps0)."""
        lo, hi = self._range()
        lo, hi = max(lo, -self.mech.eps0), min(hi, self.mech.eps0)
        up = np.zeros(0)
        for lf in self.leaves if leaves is None else leaves:
            cells = CurveCells.empty(step, lo, hi, rel_error=_REL)
            cells.add(lf.losses, lf.log_mass, rel=lf.rels)
            h, allow = cells.curve()
            rr = lf.rr_weight * _rr_curve(self.mech, cells.losses())
            one = h + allow + lf.inf_mass + rr * (1.0 + _REL)
            up = one if up.size == 0 else np.maximum(up, one)
        return CommonGrid(step, lo, hi).first, np.minimum(up, 1.0)

    def _envelope(self, chosen: Sequence[Leaf], s: FloatArray) -> FloatArray:
        """Upper bounds of the max over the leaves (atoms) of their curves plus allowances at
        the sorted losses `s`, from values at breakpoints only (every leaf's atoms, where their
        allowances drop, +-eps0, the ends of `s`): between two consecutive breakpoints every
        leaf's curve is linear in t = e^s (the RR part too) and its allowance constant, so
        each leaf's upper value is a line there, the max of them is below the chord of the max
        at the two ends (the right end taken with the allowances of the left), and equal to
        it where one leaf is the max at both ends. Where the max changes hands, the interval is
        split at its middle grid point (again and again), and the few points still in one are
        evaluated one by one. A few dozen atoms a leaf at large eps0 thus cost ~1e4
        breakpoints, not ~1e6 grid points, a leaf. Each leaf's allowance covers its values'
        round-off at both ends (`AtomsCurve`); the interpolation's own is added."""
        curves = [AtomsCurve(lf.losses, lf.log_mass, _REL, lf.rels) for lf in chosen]
        e0 = self.mech.eps0
        ends = [s[[0, -1]], np.array([-e0, e0])]
        brk = np.unique(np.concatenate([x for c in curves for x in (c.loss, c.reach)] + ends))
        brk = brk[(brk >= s[0]) & (brk <= s[-1])]
        weighted = any(lf.rr_weight > 0 for lf in chosen)  # (none at large eps0)

        def values(pts: FloatArray, pairs: bool) -> tuple[FloatArray, ...]:
            """(max over leaves of curve + allowance at pts, which leaf) and with `pairs` also
            (max of the curve at pts[1:] + allowance at pts[:-1], which leaf)."""
            rr = _rr_curve(self.mech, pts) * (1.0 + _REL) if weighted else np.zeros(pts.size)
            t = np.exp(pts)
            out = [np.full(pts.size, -np.inf), np.zeros(pts.size)]
            out += [np.full(pts.size - 1, -np.inf), np.zeros(pts.size - 1)] if pairs else []
            for i, (lf, c) in enumerate(zip(chosen, curves, strict=True)):
                h, al = c.at(pts, t)
                v = h + lf.inf_mass + lf.rr_weight * rr
                vals = (v + al, v[1:] + al[:-1])[: len(out) // 2]
                for best, arg, val in zip(out[::2], out[1::2], vals, strict=True):
                    better = val > best
                    best[better], arg[better] = val[better], i
            return tuple(out)

        left, arg_l, right, arg_r = values(brk, True)
        cross = np.arange(s.size)  # grid points inside an interval where the max changes hands
        for _ in range(40):  # split those intervals at their middle grid point
            k = np.clip(np.searchsorted(brk, s[cross], side="right") - 1, 0, brk.size - 2)
            keep = (arg_l[k] != arg_r[k]) & (s[cross] > brk[k])
            cross, k = cross[keep], k[keep]
            if cross.size <= 16 * len(chosen):  # (what is left: evaluated point by point)
                break
            ks, at, count = np.unique(k, return_index=True, return_counts=True)
            mid = s[cross[at + count // 2]]
            v_mid, a_mid = values(mid, False)
            # interval k becomes [P_k, mid] (right end: mid's own value, as its allowance is
            # P_k's) and [mid, P_k+1] (right end as before, again with the same allowance)
            brk, left, arg_l = (
                np.insert(x, ks + 1, y) for x, y in ((brk, mid), (left, v_mid), (arg_l, a_mid))
            )
            right, arg_r = (np.insert(x, ks, y) for x, y in ((right, v_mid), (arg_r, a_mid)))
        k = np.clip(np.searchsorted(brk, s, side="right") - 1, 0, brk.size - 2)
        t, t0, t1 = np.exp(s), np.exp(brk[k]), np.exp(brk[k + 1])
        b0, b1 = left[k], right[k]
        width = np.maximum(t1 - t0, 1e-300)
        frac = np.clip((t - t0) / width, 0.0, 1.0)
        eps = float(np.finfo(np.float64).eps)
        # the chord, with its round-off (frac is a ratio of differences of close exponentials);
        # never above the larger end (the chord of lines' max is not)
        chord = b0 + frac * (b1 - b0) + 4.0 * eps * (np.abs(b1 - b0) * t1 / width + b0 + b1)
        up = np.minimum(chord, np.maximum(b0, b1))
        cross = arg_l[k] != arg_r[k]
        if np.any(cross):
            up[cross] = np.minimum(up[cross], values(s[cross], False)[0])
        return np.asarray(up, dtype=np.float64)

    def tail_mass(self, step: float, leaves: Sequence[Leaf] | None = None) -> float:
        """An upper bound on the curves of `leaves` (default: all) beyond the top grid point
        (+inf and RR parts)."""
        lo, hi = self._range()
        top = np.array([CommonGrid(step, lo, hi).losses()[-1]])
        chosen = self.leaves if leaves is None else leaves
        return max(
            lf.inf_mass + lf.rr_weight * float(_rr_curve(self.mech, top)[0]) for lf in chosen
        )

    def exact_leaf(self, m: int) -> Leaf:
        """The exact pair of the dataset m (from the leaves if there, else computed)."""
        for lf in self.leaves:
            if lf.m1 == lf.m2 == m:
                return lf
        return leaf(self.mech, m, m)

    def loss_sd(self) -> float:
        """Standard deviation of the privacy loss of the worst exact dataset (under P): how
        fine a grid composing this pair needs."""
        lf = self.worst_atoms()
        w = np.exp(lf.log_mass - np.max(lf.log_mass))
        mean = float(np.sum(w * lf.losses) / np.sum(w))
        return math.sqrt(float(np.sum(w * (lf.losses - mean) ** 2) / np.sum(w)))

    def worst_atoms(self) -> Leaf:
        """The exact dataset whose curve has the largest area on the check grid (the attack)."""
        lo, hi = self._check_range()
        exact = [lf for lf in self.leaves if lf.exact]
        areas = [float(np.sum(self._curve(lf, self.check_step, lo, hi)[1])) for lf in exact]
        # (the largest area under the curve: a proxy for the worst dataset over all epsilons)
        return exact[int(np.argmax(areas))]


@dataclass(frozen=True)
class CommonGrid:
    """The grid points of `CurveCells.empty(step, lo, hi)` (first index and losses)."""

    step: float
    lo: float
    hi: float

    @property
    def first(self) -> int:
        """Grid index of the first point."""
        return math.floor(self.lo / self.step) - 1

    def losses(self) -> FloatArray:
        """Loss of every grid point."""
        size = math.floor(self.hi / self.step) + 3 - self.first
        return (self.first + np.arange(size, dtype=np.float64)) * self.step
