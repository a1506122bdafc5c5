"""k = 2: the exact tight delta(epsilon), certified from above and below by branch and bound,
because for binary RR the blanket bound alone is 10-30% loose.

For k = 2 every dataset of the other n-1 users is "m of them at x0, the rest at x1" for some
m in 0..n-1, and swapping the labels x0 <-> x1 maps the order (x1 | x0) at m to (x0 | x1) at
n-1-m. So the tight delta is  max_m H_m  with  H_m = H_{e^eps}(S | x0 || S | x1)  for
S = A + B + target, A ~ Bin(m, p) (others at x0 who report x0), B ~ Bin(n-1-m, q), and the
target's report Bern(p) under x0, Bern(q) under x1:
    H_m = sum_s ( (p - e q) C(s-1) - (e p - q) C(s) )^+ ,   C = law of A + B.

Scanning all n values of m costs n convolutions, so intervals of m are bounded at once. For m
in [m1, m2], the w = m2 - m1 "middle" users are at x0 or x1 in unknown proportion. k-RR with
k = 2 reports the true value with probability 1 - gamma and a uniform bit with probability
gamma = 2q. Reveal to the adversary which middle users took the uniform branch: the others'
reports are then known (the adversary knows their values), so, up to a known shift, the count
is A1 + B1 + Bin(b, 1/2) + target with A1 ~ Bin(m1, p), B1 ~ Bin(n-1-m2, q) and b ~ Bin(w,
gamma): the same for every m in the interval. The histogram alone is a post-processing of that
view, so for every such m
    H_m <= E_b[G_b] <= G_{b_min} + P(b < b_min) (p - e q),
where G_b is the hockey-stick with Bin(b, 1/2) added; G_b falls with b (adding independent
noise is a post-processing). An interval with w = 0 is evaluated exactly. Branch and bound
splits the interval with the largest bound until it is within `rtol` of the best exact H_m.

Numerics: pmfs come from log-space binomials, scaled by their maxima, summed by
`numerics.pmf_sum`: directly where that is cheap (non-negative products), else by tilted FFTs
with a certified relative error per entry (added to the margin of the entries it touches), so
n = 1e9 takes seconds: each leaf is summed only from two standard deviations below the
threshold and only that part is kept, leaves are evaluated on WORKERS threads, and an interval
that fails is cut into as many parts as its excess calls for (`split_interval`).
Windows cut at tail level e^log_tau; the mass left out (exact binomial tails, and entries no
FFT tilt certified) is added to every upper bound and subtracted from every lower bound, with a
relative float margin of 1e-9. A leaf's sum is cached across the root search's epsilons (the
threshold moves little); where a later threshold lies below what was summed, the whole law is
summed in its place.
"""

from __future__ import annotations

import heapq
import itertools
import math
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from shufflekit.accountant.core import Mechanism
from shufflekit.accountant.numerics.binomial import log_cdf, tail_window_int
from shufflekit.accountant.numerics.krr import krr
from shufflekit.accountant.numerics.logspace import log1mexp
from shufflekit.accountant.numerics.pmf_sum import (
    SUMS,
    Piece,
    PmfSum,
    binomial_piece,
    pmf_sum,
)
from shufflekit.base.errors import InternalError, InvalidParameters

_FLOAT_REL = 1e-9  # relative error allowance for one evaluation (pmfs + direct convolution)
_UNDERFLOW = 1e-280  # absolute allowance for entries that underflow in the scaled products
S = TypeVar("S")
R = TypeVar("R")
WORKERS = min(4, os.cpu_count() or 1)  # threads evaluating leaves (the k = 2 pair's too)
#: From here a leaf is an FFT sum (~0.01-0.5 s): worth threads, wide splits and cache keys that
#: stay put across epsilons; below, plain halving and exact levels cost less.
LARGE_N = 1_000_000


@dataclass(frozen=True)
class K2Bound:
    """Tight delta(eps) of shuffled binary RR: certified log upper and log lower bounds."""

    log_upper: float  # sound: >= log max_m H_m
    log_lower: float  # exact H_m of `worst_m`, minus truncation and float allowances
    worst_m: int  # others at x0 in the worst dataset found (order x0 | x1)
    converged: bool  # upper within rtol of lower (else the evaluation budget ran out)
    evaluations: int  # convolutions evaluated
    log_dropped: float  # largest mass cut off by the windows (added to an interval's bound)


def _hockey(total: PmfSum, a: float, b: float) -> tuple[float, float, float] | None:
    """(log upper, log lower, log dropped) of H for C = `total` (+ target bit);
    a = p - e^eps q, b = e^eps p - q (given without cancellation).

    If `total` is `partial` (its mass below `lo` not accounted for), the terms below are left
    out where that is exact: C is log-concave (a sum of binomials), so C(s-1)/C(s) grows with
    s and a term a C(s-1) - b C(s) certified negative at some s > lo makes every term below it
    negative too. None if no such s is found (the caller then sums everything)."""
    c, log_scale, dropped = total.vals, total.log_scale, total.log_out
    cm1, c0, own = total.neighbours()  # C(s-1), C(s) for s = lo .. hi+1
    rel = _FLOAT_REL + own
    lin = a * cm1 - b * c0
    gross = a * cm1 + b * c0
    near = lin > -2 * rel * gross
    if total.partial:
        negative = np.flatnonzero((cm1 > 0) & (c0 > 0) & ~near)  # (C(lo - 1) is not known)
        if negative.size == 0:
            return None
        cut = int(negative[-1]) + 1  # terms 0 .. cut-1 are negative: exactly 0 in H
        lin[:cut] = 0.0
        near[:cut] = False
    body = float(np.sum(lin[lin > 0]))
    margin = 2 * float(np.sum((rel * gross)[near]))
    log_body = math.log(body) + log_scale if body > 0 else -math.inf
    log_margin = math.log(margin) + log_scale if margin > 0 else -math.inf
    log_under = math.log(_UNDERFLOW * c.size)
    slack_up = float(np.logaddexp.reduce([log_margin, log_under, math.log(a) + dropped]))
    upper = float(np.logaddexp(log_body, slack_up))
    slack_low = float(np.logaddexp.reduce([log_margin, log_under, math.log(b) + dropped]))
    lower = log_body + log1mexp(slack_low - log_body) if log_body > slack_low else -math.inf
    return upper, lower, dropped


class _Evaluator:
    """Bounds of H over intervals of m for one (mech, eps), caching the binomial windows."""

    def __init__(self, mech: Mechanism, eps: float, log_tau: float) -> None:
        rr = krr(2, mech.eps0)
        self.q, self.p, self.gamma = rr.q, rr.p, rr.gamma
        self.e = math.exp(eps)
        # p - e q = p (1 - e^(eps - eps0)) and e p - q = q (e^(eps + eps0) - 1): accurate near
        # eps0 and for tiny eps0 (where p and q round to the same double)
        self.a = self.p * -math.expm1(eps - mech.eps0)
        s = eps + mech.eps0
        self.b = self.q * math.expm1(s) if s < 700.0 else self.e * self.p - self.q
        self.n1 = mech.n - 1
        self.theta = math.log(self.b / self.a)  # the tilt that centres C on the threshold
        self.log_tau = log_tau
        self.log_b_tau = log_tau  # level below which small blanket counts are paid for in full
        self.evaluations = 0
        self.max_dropped = -math.inf
        self._lock = threading.Lock()

    def _hockey_of(self, m1: int, m2: int, b_min: int) -> tuple[float, float, float]:
        """`_hockey` of the law of A1 + B1 + Bin(b_min, 1/2), summed where the hockey-stick
        needs it (from a few standard deviations below its threshold: the peak of the tilt
        log(b/a)) and the whole law only if that does not reach below the threshold. Cached
        by leaf: the root search over epsilon moves the threshold little."""
        key = (self.n1, self.p, m1, m2, b_min, self.log_tau)
        # mass left uncertified by the FFTs is paid in full: e^-20 below what an interval pays
        # for its unrevealed users (~rtol delta / 20) is plenty (k2_bounds checks it) and
        # saves the extra tilts the windows' own e^-60 would take
        out = max(self.log_tau, self.log_b_tau - 20.0)
        total = SUMS.get(key)
        if total is None:
            pieces = self._pieces(m1, m2, b_min)
            total = SUMS.put(key, pmf_sum(pieces, tail_tilt=self.theta, log_out_target=out))
        res = _hockey(total, self.a, self.b)
        if res is None:  # the threshold lies below what was summed: sum everything
            total = pmf_sum(self._pieces(m1, m2, b_min), log_out_target=out)
            SUMS.replace(key, total)
            res = _hockey(total, self.a, self.b)
        if res is None:  # a whole law is accounted for from its first entry: never
            raise InternalError(f"k = 2 leaf [{m1}, {m2}]: no hockey-stick from its whole law")
        return res

    def _pieces(self, m1: int, m2: int, b_min: int) -> list[Piece]:
        return [
            binomial_piece(m1, self.p, self.log_tau),
            binomial_piece(self.n1 - m2, self.q, self.log_tau),
            binomial_piece(b_min, 0.5, self.log_tau),
        ]

    def interval(self, m1: int, m2: int) -> tuple[float, float]:
        """(log upper bound over m in [m1, m2], log lower bound of H_{m1} or -inf)."""
        w = m2 - m1
        extra, b_min = -math.inf, 0
        if w > 0:
            b_min = tail_window_int(w, self.gamma, self.log_b_tau)[0]
            if b_min > 0:
                extra = float(log_cdf(b_min - 1, w, self.gamma, "upper")) + math.log(self.a)
        up, low, dropped = self._hockey_of(m1, m2, b_min)
        with self._lock:
            self.evaluations += 1
            self.max_dropped = max(self.max_dropped, dropped)
        return float(np.logaddexp(up, extra)), (low if w == 0 else -math.inf)

    def intervals(self, spans: list[tuple[int, int]]) -> list[tuple[float, float]]:
        """`interval` of each span, on up to WORKERS threads (the transforms release the GIL)."""
        return on_threads(lambda ab: self.interval(*ab), spans, self.n1 >= LARGE_N)


def on_threads(fn: Callable[[S], R], items: Sequence[S], threaded: bool = True) -> list[R]:
    """[fn(x) for x in items], on up to WORKERS threads if `threaded` and there is more than one
    (the transforms and convolutions of a leaf release the GIL)."""
    if not threaded or len(items) < 2 or WORKERS < 2:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(WORKERS) as pool:
        return list(pool.map(fn, items))


def default_cuts(n: int) -> list[int]:
    """Initial partition of m in 0..n-1 (sorted cut points, 0 first, n last).

    Singletons at both ends (the extreme datasets, usually the worst), intervals growing
    geometrically away from them (x1.5 from the top end, x4 from the bottom), because H_m
    changes fastest near the ends. Only a starting point: branch and bound refines it.
    The geometric cuts start at n / 1e5 from the ends (two singletons at each end below
    that): an interval that narrow is as good as its exact values (what revealing its
    uniform reports takes away is a ~1e-5 share of the count's variance), and at n = 1e9
    the finer cuts cost ~30 more evaluations of ~0.1 s for nothing.
    """
    n1 = n - 1
    cuts = {0, n, 1, 2, max(n1 - 1, 0), max(n1, 0)}
    d = max(1.0, n / 1e5)
    while d < n:
        cuts.add(max(0, n1 - int(d)))
        d *= 1.5
    d = max(1.0, n / 1e5)
    while d < n:
        cuts.add(min(n, 1 + int(d)))
        d *= 4.0
    return sorted(c for c in cuts if 0 <= c <= n)


def k2_bounds(
    mech: Mechanism,
    eps: float,
    *,
    log_tau: float | None = None,
    rtol: float = 0.02,
    max_evaluations: int = 4000,
    cuts: list[int] | None = None,
    target: float | None = None,
) -> tuple[K2Bound, list[int]]:
    """Certified bounds on the tight delta(eps) for k = 2 (see the module docstring).

    rtol: stop when upper <= (1 + rtol) lower (in delta). If `max_evaluations` convolutions do
    not get there, the upper bound returned is still sound, only looser (`converged` False).
    `cuts`: a starting partition (e.g. the one returned for a nearby epsilon); the partition
    reached is returned with the bound. log_tau: truncation level of the windows (default:
    chosen from the answer, deepened until the truncated mass is negligible). `target`: a log
    delta that only needs to be decided: stop as soon as the upper bound is below it or an
    exact value above it (the bound returned is then sound but may be loose).
    """
    if mech.k != 2:
        raise InvalidParameters(f"k2_bounds needs k = 2, got k = {mech.k}")
    if not (0 <= eps < mech.eps0):
        raise InvalidParameters(f"k2_bounds needs 0 <= eps < eps0, got {eps!r}")
    n = mech.n
    start = default_cuts(n) if cuts is None else sorted(set(cuts) | {0, n})
    if start[0] != 0 or start[-1] != n:
        raise InvalidParameters("cuts must lie in 0..n")
    tau = -60.0 if log_tau is None else log_tau
    for _ in range(6):  # tau: -60, -120, -240, -480, -700 at most
        res, leaves = _branch_and_bound(mech, eps, tau, rtol, max_evaluations, start, target)
        floor = res.log_lower if res.log_lower > -math.inf else res.log_upper
        if log_tau is not None or res.log_dropped <= floor - 20.0 or tau <= -700.0:
            return res, leaves
        tau = max(-700.0, min(2.0 * tau, floor - 30.0))
        start = leaves
    return res, leaves


def _branch_and_bound(
    mech: Mechanism,
    eps: float,
    log_tau: float,
    rtol: float,
    max_evaluations: int,
    cuts: list[int],
    target: float | None,
) -> tuple[K2Bound, list[int]]:
    ev = _Evaluator(mech, eps, log_tau)
    best_low, best_m = -math.inf, ev.n1
    heap: list[tuple[float, int, int]] = []  # (-log upper, m1, m2)

    def push(m1: int, m2: int, bounds: tuple[float, float]) -> None:
        nonlocal best_low, best_m
        up, low = bounds
        if low > best_low:
            best_low, best_m = low, m1
            # P(b < b_min) is paid in full: keep it ~rtol/20 of delta, no smaller than needed
            level = min(-10.0, low + log_rtol - 3.0)
            if ev.n1 >= LARGE_N:  # whole numbers: the leaves' sums stay cached across
                level = float(math.floor(level))  # the root search's epsilons
            ev.log_b_tau = max(log_tau, level)
        heapq.heappush(heap, (-up, m1, m2))

    log_rtol = math.log1p(rtol)
    pairs = list(itertools.pairwise(cuts))  # singletons first: their exact values set log_b_tau
    for batch in (
        [pr for pr in pairs if pr[1] == pr[0] + 1],
        [pr for pr in pairs if pr[1] > pr[0] + 1],
    ):
        spans = [(a, b - 1) for a, b in batch]
        for span, res in zip(spans, ev.intervals(spans), strict=True):
            push(*span, res)
    while True:
        neg_up, m1, m2 = heap[0]
        top = -neg_up
        if top <= best_low + log_rtol or top == -math.inf:
            converged = True
            break
        if target is not None and (top <= target or best_low > target):
            converged = False  # decided, not converged
            break
        if m1 == m2 or ev.evaluations >= max_evaluations:
            converged = False  # allowances exceed rtol at an exact value, or out of budget
            break
        heapq.heappop(heap)
        wide = ev.n1 >= LARGE_N  # (below, plain halving evaluates fewer)
        spans = split_interval(m1, m2, top - best_low if wide else 0.0, log_rtol)
        for span, res in zip(spans, ev.intervals(spans), strict=True):
            push(*span, res)
    leaves = sorted({m1 for _, m1, _ in heap} | {ev.n1 + 1})
    bound = K2Bound(
        log_upper=-heap[0][0],
        log_lower=best_low,
        worst_m=best_m,
        converged=converged,
        evaluations=ev.evaluations,
        log_dropped=ev.max_dropped,
    )
    return bound, leaves


def split_interval(
    m1: int, m2: int, log_excess: float = 0.0, log_rtol: float = 1.0, max_parts: int = 16
) -> list[tuple[int, int]]:
    """Equal parts of [m1, m2] (halves by default) for an interval whose bound exceeds the best
    exact value by e^log_excess. What the bound gives away (the revealed users' share of the
    variance) grows with the width, and log delta with it about linearly, so parts of
    1 / (excess / rtol) of the width usually pass at once (2 to `max_parts` parts; halving
    alone re-splits wide intervals level by level: ~1.5x the evaluations at n = 1e9)."""
    parts = 2
    if math.isfinite(log_excess) and log_excess > 0:
        parts = max(2, min(max_parts, math.ceil(1.5 * log_excess / log_rtol)))
    parts = min(parts, m2 - m1 + 1)
    edges = [m1 + (m2 - m1 + 1) * i // parts for i in range(parts + 1)]
    return [(a, b - 1) for a, b in itertools.pairwise(edges) if b > a]


def k2_log_delta_m(
    mech: Mechanism, m: int, eps: float, log_tau: float = -60.0
) -> tuple[float, float]:
    """(log upper, log lower) of H_m for the single dataset "m others at x0, rest at x1"."""
    if mech.k != 2 or not (0 <= m <= mech.n - 1):
        raise InvalidParameters(f"k2_log_delta_m needs k = 2 and 0 <= m <= n-1, got m = {m}")
    if not (0 <= eps < mech.eps0):
        raise InvalidParameters(f"k2_log_delta_m needs 0 <= eps < eps0, got {eps!r}")
    return _Evaluator(mech, eps, log_tau).interval(m, m)
