"""Identical k = 2 rounds composed by dynamic programming over the running privacy loss: a sound
upper bound that stays within a fraction of a percent of the composed attack where composing
one dominating pair per round is several percent loose (composed epsilon above about 10).

Why composing one pair is loose there. The k = 2 datasets ("m others at x0") have curves that
cross: m = n-1 is the worst at most positive epsilons, m = 0 (its mirror) at the negative ones,
others in between. A dominating pair must lie above all of them (`k2_compose`); no dataset has
that curve, and composing it costs more than any sequence of datasets does.

What is computed instead: the best any adversary can do who picks each round's dataset (any m,
either orientation) after seeing the earlier rounds' outputs. Write l for the privacy loss so
far and V_i(l) for the most the hockey-stick E[(1 - e^(eps - L))^+] of the whole run can still
reach after i rounds; V_R(l) = (1 - e^(eps - l))^+ and V_i(l) = sup_m E_m[V_i+1(l + L)].
The delta of the R rounds at eps is V_0(0). Every V_i is increasing in l and convex in y = e^-l
(sup and expectations keep both), and for such a function E_P[V(l + L)] is a positive mixture of
the pair's hockey-stick values H_t(P || Q) (L = log dP/dQ under P). So a pair whose curve lies
above another's at every t gives a larger step: the datasets of one group of leaves may be
replaced by the convex hull of the max of the group's curves (`k2_compose`: each leaf covers
its m by post-processing), and V_i(l) <= max over groups of E_group[V_i+1(l + L)]. Groups are
small at the two ends of m (one leaf each) where the curves cross, larger in the middle. The
adversary only gains from choosing adaptively, so the bound is valid for adaptively chosen data
too (which is what dominating-pair composition promises).

Numerics. Losses of every group's hull sit on one grid of `step`; the recursion is exact on it.
The loss window is [bottom, TOP]: above it V <= G (a running bound on sup V); the bottom rises
each round to where V falls under 1e-18, and what lies under it counts as 1e-18 in a floor that
is added to every value (about 1e-15 after 1,000 rounds). Correlations run by FFT block by
block (overlap-save, all groups at once) and each output gets a bound on its round-off relative
to its own block's values (log2(size) ||block||_2 ||kernel||_1 times `pmf_sum.FFT_ROUNDOFF`),
so small deltas stay accurate; the allowance carried forward is tracked through the same
kernels, and an epsilon whose delta is more than 10% allowance is refused (the pair's bound
then stands). The shift l -> l - eps maps the recursion for eps onto the one for 0, so one run
gives delta at every eps = j * step (epsilon is rounded up to the grid).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import scipy.fft as sfft

from shufflekit.accountant.core import Mechanism
from shufflekit.accountant.curve_cells import upper_grid
from shufflekit.accountant.curve_pld import k2_pair
from shufflekit.accountant.k2_compose import ATOMS_MAX_N, K2Pair, Leaf
from shufflekit.accountant.numerics.grid import GridPLD
from shufflekit.accountant.numerics.pmf_sum import FFT_ROUNDOFF
from shufflekit.base.arrays import FloatArray
from shufflekit.base.errors import InvalidParameters

#: The DP runs when composing the pair is this far (relative, in epsilon) above the attack.
DP_GAP = 0.015
#: Leaves kept alone at each end of m (where the curves cross), and group size elsewhere.
EDGE_LEAVES = 10
GROUP_LEAVES = 8
#: Grid step = (epsilon of the composed pair) / RESOLUTION.
RESOLUTION = 5e3
#: Top of the loss window (above it V is bounded by G; V there is within e^-TOP of it).
TOP = 5.0
#: Most rounds the DP is run for (its cost is linear in the rounds), most grid points in its
#: loss window (a coarser step beyond), and most work (rounds x groups x window) it takes on.
MAX_ROUNDS = 10_000
MAX_WINDOW = 200_000
MAX_WORK = 1e9  # ~20 s at ~20 ns a unit
_FFT_ERR = FFT_ROUNDOFF  # times log2(size) ||x||_2 ||y||_1: FFT correlation round-off
_TAU = 1e-18  # below this, V counts as this (the window bottom rises above it)


@dataclass(frozen=True)
class DpCurve:
    """delta(eps) <= values[x - first] at eps = -x * step (x <= 0), for `rounds` rounds."""

    step: float
    first: int
    values: FloatArray
    errors: FloatArray  # the round-off allowance included in each value (at most)
    rounds: int
    groups: int
    seconds: float

    def _index(self, epsilon: float) -> int:
        """Index of the grid point at or below `epsilon` (delta decreases in epsilon)."""
        x = math.ceil(-epsilon / self.step)
        if -x * self.step > epsilon:  # float rounding: keep eps' = -x step <= epsilon
            x += 1
        return min(max(x, self.first), self.first + self.values.size - 1) - self.first

    def delta(self, epsilon: float) -> float:
        """Upper bound on delta at `epsilon` (>= 0); below the window, its bottom value."""
        return min(1.0, float(self.values[self._index(epsilon)]))

    def error(self, epsilon: float) -> float:
        """The round-off allowance included in `delta(epsilon)` (at most)."""
        return float(self.errors[self._index(epsilon)])

    def epsilon(self, delta: float, max_error_fraction: float = 0.1) -> float:
        """Smallest grid epsilon >= 0 at which the bound on delta is <= `delta`; inf if none, or
        if round-off makes up more than `max_error_fraction` of delta there."""
        top = min(-self.first, self.values.size - 1)  # index of x = 0
        ok = np.flatnonzero(self.values[: top + 1] <= delta)
        if ok.size == 0 or self.errors[ok[-1]] > max_error_fraction * delta:
            return math.inf
        return -(int(ok[-1]) + self.first) * self.step  # the largest x <= 0

    def summary(self) -> dict[str, float | int | str]:
        """Numbers for a result's details."""
        top = min(-self.first, self.values.size - 1)
        return {
            "method": "k2-adaptive-dp",
            "rounds": self.rounds,
            "groups": self.groups,
            "step": self.step,
            "max_roundoff_at_eps_ge_0": float(np.max(self.errors[: top + 1])),
            "seconds": round(self.seconds, 3),
        }


def groups(pair: K2Pair) -> list[list[Leaf]]:
    """The pair's leaves by m: EDGE_LEAVES alone at each end, GROUP_LEAVES together between."""
    leaves = sorted(pair.leaves, key=lambda lf: lf.m1)
    n = len(leaves)
    out: list[list[Leaf]] = []
    i = 0
    while i < n:
        size = 1 if (i < EDGE_LEAVES or i >= n - EDGE_LEAVES) else GROUP_LEAVES
        j = min(i + size, max(n - EDGE_LEAVES, i + 1))
        out.append(leaves[i:j])
        i = j
    return out


def group_plds(pair: K2Pair, step: float) -> list[GridPLD]:
    """One dominating grid PLD per group (hull of the max of its leaves' curves)."""
    out = []
    for g in groups(pair):
        first, vals = pair.upper_values(step, g)
        tail = max(pair.tail_mass(step, g), float(vals[-1]))
        vals[-1] = tail
        out.append(upper_grid(step, first, vals, tail, f"k2dp:{g[0].m1}-{g[-1].m2}:{step!r}"))
    return out


def _correlate(
    ext: FloatArray, kf: npt.NDArray[np.complex128], s: int, block: int, nb: int, knorm: float
) -> tuple[FloatArray, FloatArray]:
    """Valid correlations of `ext` with every kernel (`kf`: transforms of the reversed kernels
    of length `s` at size `nb`), block by block (overlap-save), and a bound on each output's
    FFT round-off: relative to its own block's values, so small values stay accurate."""
    out_len = ext.size - s + 1
    nblocks = -(-out_len // block)
    padded = np.concatenate([ext, np.zeros(nblocks * block + s - 1 - ext.size)])
    segs = np.lib.stride_tricks.sliding_window_view(padded, block + s - 1)[::block]
    full = sfft.irfft(sfft.rfft(segs, nb, axis=1)[None, :, :] * kf[:, None, :], nb, axis=2)
    w = full[:, :, s - 1 : s - 1 + block].reshape(kf.shape[0], nblocks * block)[:, :out_len]
    norms = np.sqrt(np.sum(segs * segs, axis=1)) * (_FFT_ERR * math.log2(nb) * knorm)
    return w, np.repeat(norms, block)[:out_len]


def dp_curve(plds: list[GridPLD], rounds: int, step: float, top: float = TOP) -> DpCurve:
    """The recursion of the module docstring over `rounds` rounds, each round choosing the best
    of `plds` (all on the grid of `step`) at every running loss."""
    t0 = time.perf_counter()
    o = min(p.offset for p in plds)
    s = max(p.offset + p.probs.size for p in plds) - o
    kern = np.zeros((len(plds), s))
    for i, p in enumerate(plds):
        kern[i, p.offset - o : p.offset - o + p.probs.size] = p.probs
    inf = np.array([p.inf_mass for p in plds])
    mass = float(np.max(kern.sum(axis=1) + inf))
    knorm = float(np.max(np.sum(np.abs(kern), axis=1)))  # ||y||_1 (the rigorous pairing)
    block = s
    nb = sfft.next_fast_len(block + s - 1, real=True)
    kf = sfft.rfft(kern[:, ::-1], nb, axis=1)
    hi_pad = max(o + s - 1, 0)  # grid points above the window a round's top loss reaches
    b = math.ceil(top / step)
    a = 0
    v = -np.expm1(-np.arange(0, b + 1) * step)  # V_R(x step) for eps = 0; 0 below the window
    e = np.zeros_like(v)  # how much of v is round-off allowance (at most)
    g = 1.0  # sup of V
    # V <= v + floor in the window and <= below + floor under it (v is computed with zeros
    # under the window, so that the window's bottom can rise where v is negligible)
    floor, below = 0.0, 0.0
    for _ in range(rounds):
        ext = np.concatenate([np.zeros(s - 1), v, np.full(hi_pad, g)])
        w, fft_err = _correlate(ext, kf, s, block, nb, knorm)
        new = np.max(w + inf[:, None] * g, axis=0) + fft_err
        new = np.maximum.accumulate(np.maximum(new, 0.0))
        e_ext = np.concatenate([np.zeros(s - 1), e, np.zeros(hi_pad)])
        # the allowance carried forward, through the same kernels (the max over them bounds the
        # allowance in the max), with a relative margin for its own round-off
        carried, carried_err = _correlate(e_ext, kf, s, block, nb, knorm)
        e = np.max(np.maximum(carried, 0.0), axis=0) * (1.0 + 1e-6) + carried_err + fft_err
        floor = mass * (floor + below)
        g = mass * g
        x_lo = a - (o + s - 1)
        cut = int(np.argmax(new >= _TAU)) if new[-1] >= _TAU else 0
        # under the window: below _TAU where cut, else at most the jump to +inf loss (x_lo is
        # as low as any finite loss reaches from the old window)
        below = _TAU if cut > 0 else float(np.max(inf)) * g
        a, v, e = x_lo + cut, new[cut:], e[cut:]
    v, e = v + floor, e + floor
    return DpCurve(step, a, v, e, rounds, len(plds), time.perf_counter() - t0)


def k2_dp_curve(mech: Mechanism, rounds: int, epsilon_hint: float) -> DpCurve:
    """The DP bound of `rounds` identical k = 2 rounds, on a grid fine relative to
    `epsilon_hint` (the composed pair's epsilon: the answer is below it)."""
    if mech.k != 2 or mech.n > ATOMS_MAX_N:  # (its grid steps need the leaves' atoms)
        raise InvalidParameters(f"the k = 2 DP needs k = 2 and n <= {ATOMS_MAX_N:,}")
    if not (1 <= rounds <= MAX_ROUNDS):
        raise InvalidParameters(f"the k = 2 DP runs 1 to {MAX_ROUNDS:,} rounds, got {rounds}")
    step = dp_step(epsilon_hint)
    pair = k2_pair(mech)
    return dp_curve(group_plds(pair, step), rounds, step)


def dp_step(epsilon_hint: float) -> float:
    """The grid step for a composed epsilon near `epsilon_hint`: epsilon / RESOLUTION, coarser
    where the window [-epsilon, TOP] would pass MAX_WINDOW points."""
    eps = max(epsilon_hint, 1e-3)
    return max(eps / RESOLUTION, (eps + TOP) / MAX_WINDOW)


def affordable(mech: Mechanism, rounds: int, epsilon_hint: float) -> bool:
    """Whether the DP's work (rounds x groups x window points) stays under MAX_WORK and its
    grid resolves one round's spread of losses (else it would be looser than the pair)."""
    step = dp_step(epsilon_hint)
    window = (max(epsilon_hint, 1e-3) + TOP + 2 * mech.eps0) / step
    pair = k2_pair(mech)
    return rounds * len(groups(pair)) * window <= MAX_WORK and step <= pair.loss_sd() / 8


class K2Tightener:
    """The DP bound of `rounds` rounds of `mech`, computed lazily where composing the pair is
    far above the attack (epsilon gap > DP_GAP; delta ratio > 1 + 10 DP_GAP) and used when its
    numerical error is at most MAX_ERROR_FRACTION of the delta (the minimum of two sound upper
    bounds is sound)."""

    MAX_ERROR_FRACTION = 0.1

    def __init__(self, mech: Mechanism, rounds: int) -> None:
        self.mech, self.rounds = mech, rounds
        self.curve: DpCurve | None = None

    @staticmethod
    def applies(mechs: Sequence[Mechanism], counts: Sequence[int]) -> bool:
        """One k = 2 mechanism (n <= ATOMS_MAX_N), 2 to MAX_ROUNDS rounds."""
        return (
            len(mechs) == 1
            and mechs[0].k == 2
            and mechs[0].n <= ATOMS_MAX_N
            and 2 <= sum(counts) <= MAX_ROUNDS
        )

    def _curve(self, epsilon_hint: float) -> DpCurve | None:
        """The DP's curve on a grid fine enough for `epsilon_hint` (None: too much work)."""
        if self.curve is None or self.curve.step > 1.5 * dp_step(epsilon_hint):
            if not affordable(self.mech, self.rounds, epsilon_hint):
                return None
            self.curve = _shared_curve(self.mech, self.rounds, epsilon_hint)
        return self.curve

    def epsilon(self, delta: float, upper: float, lower: float | None) -> float:
        """min(upper, the DP's epsilon at `delta`) where the gap upper / lower - 1 > DP_GAP."""
        if lower is None or lower <= 0 or not math.isfinite(upper) or upper / lower - 1 <= DP_GAP:
            return upper
        c = self._curve(upper)
        return upper if c is None else min(upper, c.epsilon(delta, self.MAX_ERROR_FRACTION))

    def log_delta(self, epsilon: float, upper: float, lower: float | None) -> float:
        """min(upper, log of the DP's delta at `epsilon`) where the delta ratio is > 1 + 10 DP_GAP
        (logs of delta in and out)."""
        if lower is None or not math.isfinite(lower) or upper - lower <= math.log1p(10 * DP_GAP):
            return upper
        c = self._curve(epsilon)
        d = c.delta(epsilon) if c is not None else 0.0
        if c is None or d <= 0 or c.error(epsilon) > self.MAX_ERROR_FRACTION * d:
            return upper
        return min(upper, math.log(d))

    def summary(self) -> dict[str, Any] | None:
        """The DP's numbers if it ran, else None."""
        return dict(self.curve.summary()) if self.curve is not None else None


@functools.lru_cache(maxsize=8)
def _shared_curve(mech: Mechanism, rounds: int, epsilon_hint: float) -> DpCurve:
    """`k2_dp_curve`, once per process for the same question: the ledger's charge and the CLI's
    own bounds of the same rounds ask it with the same hint (the composed pair's epsilon)."""
    return k2_dp_curve(mech, rounds, epsilon_hint)


def clear_cache() -> None:
    """Forget the DP curves kept per process."""
    _shared_curve.cache_clear()
