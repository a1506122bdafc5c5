"""Calibration: the largest eps0, or the smallest n, that keeps a run of rounds within budget.

Both searches ask the composition accountant (`accountant.composition`) the same question, "is
the composed upper bound at `delta` at most `epsilon`?", for trial parameters:

- `calibrate_eps0(n, k, rounds, epsilon, delta)`: largest eps0 such that `rounds` rounds of
  k-RR(eps0) over n users (after the rounds already `spent`) have composed epsilon <= target.
- `calibrate_n(eps0, k, rounds, epsilon, delta)`: smallest n with the same property.

Search (documented tolerance): the feasibility of a trial is monotone in the parameter for the
true privacy loss (smaller eps0 is a post-processing of larger eps0; more users hide the target
better - observed, not proven, for n). The search brackets the answer by walking from a starting
point (`_bracket`: steps predicted by extrapolation, at least x1.25, at most x16), then shrinks
the bracket, always keeping a trial that was *checked feasible* as one end: interpolation of
log(composed epsilon) against eps0 (resp. log n) predicts the boundary and two trials straddle the
prediction (so one good prediction ends the search), safeguarded by bisection so that the
bracket at least halves every four steps (`_search`). It stops when
hi/lo - 1 <= rtol (eps0, default 1e-3) or hi - lo <= max(1, rtol*hi) (n, default rtol 0:
the exact integer). The returned value is always a trial whose composed upper bound was
computed and met the target, and it is checked once more before returning (soundness does not
depend on monotonicity; only optimality within the tolerance does).

Per-round PLDs come from `pld_fn(Mechanism)` (default `accountant.tight.tight_pld`, imported
lazily) and are cached by (pld_fn, n, k, eps0).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from shufflekit.accountant.composition import PldFn, compose_rounds
from shufflekit.accountant.core import Mechanism
from shufflekit.base.errors import InvalidParameters, NotApplicable

#: Default relative tolerance of the eps0 search.
EPS0_RTOL = 1e-3


@dataclass(frozen=True)
class Calibration:
    """Result of a calibration: `value` meets the target; `achieved_epsilon` is its bound."""

    parameter: str
    value: float
    achieved_epsilon: float
    target_epsilon: float
    delta: float
    rounds: int
    evaluations: int
    bracket: tuple[float, float]
    seconds: float
    engine: str
    trials: list[tuple[float, float]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {
            "parameter": self.parameter,
            "value": self.value,
            "achieved_epsilon": self.achieved_epsilon,
            "target_epsilon": self.target_epsilon,
            "delta": self.delta,
            "rounds": self.rounds,
            "evaluations": self.evaluations,
            "bracket": list(self.bracket),
            "seconds": self.seconds,
            "engine": self.engine,
        }


def _check_common(rounds: int, epsilon: float, delta: float) -> None:
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise InvalidParameters(f"rounds must be an integer >= 1, got {rounds!r}")
    if not (isinstance(epsilon, float | int) and math.isfinite(epsilon) and epsilon > 0):
        raise InvalidParameters(f"target epsilon must be a finite number > 0, got {epsilon!r}")
    if not (isinstance(delta, float | int) and 0 < delta < 1):
        raise InvalidParameters(f"delta must be in (0, 1), got {delta!r}")


class _Evaluator:
    """Composed upper-bound epsilon of `spent` + `rounds` x mech(param), memoised."""

    def __init__(
        self,
        make: Callable[[float], Mechanism],
        rounds: int,
        delta: float,
        spent: Sequence[Mechanism],
        pld_fn: PldFn | None,
        engine: str,
        grid: float | None,
    ) -> None:
        self.make, self.rounds, self.delta = make, rounds, delta
        self.spent = list(spent)
        for m in self.spent:
            if not isinstance(m, Mechanism):
                raise InvalidParameters(f"spent rounds must be Mechanism, got {type(m).__name__}")
        self.pld_fn, self.engine, self.grid = pld_fn, engine, grid
        self.memo: dict[float, float] = {}

    def __call__(self, param: float) -> float:
        if param in self.memo:
            return self.memo[param]
        mech = self.make(param)
        mechs = [*self.spent, mech]
        counts = [1] * len(self.spent) + [self.rounds]
        c = compose_rounds(
            mechs, pld_fn=self.pld_fn, counts=counts, engine=self.engine, grid=self.grid
        )
        eps = c.epsilon(self.delta)
        self.memo[param] = eps
        return eps


def calibrate_eps0_detailed(
    n: int,
    k: int,
    rounds: int,
    epsilon: float,
    delta: float,
    *,
    pld_fn: PldFn | None = None,
    engine: str = "dp_accounting",
    grid: float | None = None,
    spent: Sequence[Mechanism] = (),
    rtol: float = EPS0_RTOL,
    eps0_min: float = 1e-3,
    eps0_max: float = 30.0,
    eps0_start: float | None = None,
) -> Calibration:
    """Largest eps0 (within rtol) such that the composition meets (epsilon, delta); details."""
    t0 = time.perf_counter()
    _check_common(rounds, epsilon, delta)
    Mechanism(n, k, 1.0)  # validates n and k
    if not (0 < rtol < 1):
        raise InvalidParameters(f"rtol must be in (0, 1), got {rtol!r}")
    if not (0 < eps0_min < eps0_max and math.isfinite(eps0_max)):
        raise InvalidParameters("need 0 < eps0_min < eps0_max < inf")
    ev = _Evaluator(lambda e: Mechanism(n, k, float(e)), rounds, delta, spent, pld_fn, engine, grid)

    def feasible(e: float) -> bool:
        return ev(e) <= epsilon

    start = eps0_start if eps0_start is not None else epsilon / (rounds + len(ev.spent))
    lo, hi = _bracket(ev, epsilon, start, eps0_min, eps0_max, feasible_below=True, integer=False)
    if lo is None:
        raise NotApplicable(
            f"even eps0 = {eps0_min:g} does not meet epsilon={epsilon:g} at delta={delta:g} "
            f"after {len(ev.spent)} spent rounds (composed bound {ev(eps0_min):.4g})"
        )
    if hi is None:  # feasible up to the cap
        value = lo
    else:
        value = _search(ev, epsilon, lo, hi, rtol=rtol, integer=False, log_x=False)
        hi = min(h for h in ev.memo if not feasible(h) and h > value)
    final = ev(value)
    if not final <= epsilon:  # pragma: no cover - guarded by construction
        raise AssertionError("calibration returned an infeasible eps0")
    return Calibration(
        parameter="eps0",
        value=float(value),
        achieved_epsilon=final,
        target_epsilon=float(epsilon),
        delta=float(delta),
        rounds=rounds,
        evaluations=len(ev.memo),
        bracket=(float(value), float(hi) if hi is not None else math.inf),
        seconds=time.perf_counter() - t0,
        engine=engine,
        trials=sorted(ev.memo.items()),
    )


def calibrate_eps0(
    n: int,
    k: int,
    rounds: int,
    epsilon: float,
    delta: float,
    *,
    pld_fn: PldFn | None = None,
    engine: str = "dp_accounting",
    grid: float | None = None,
    spent: Sequence[Mechanism] = (),
    rtol: float = EPS0_RTOL,
    eps0_min: float = 1e-3,
    eps0_max: float = 30.0,
) -> float:
    """Largest eps0 such that `rounds` rounds at n users (after `spent`) meet (epsilon, delta).

    The value returned was checked: its composed upper bound is <= epsilon. It is within
    relative tolerance `rtol` of the largest such eps0 if feasibility is monotone in eps0.
    Raises NotApplicable if even eps0_min fails; returns eps0_max if that still meets it.
    """
    return calibrate_eps0_detailed(
        n,
        k,
        rounds,
        epsilon,
        delta,
        pld_fn=pld_fn,
        engine=engine,
        grid=grid,
        spent=spent,
        rtol=rtol,
        eps0_min=eps0_min,
        eps0_max=eps0_max,
    ).value


def calibrate_n_detailed(
    eps0: float,
    k: int,
    rounds: int,
    epsilon: float,
    delta: float,
    *,
    pld_fn: PldFn | None = None,
    engine: str = "dp_accounting",
    grid: float | None = None,
    spent: Sequence[Mechanism] = (),
    rtol: float = 0.0,
    n_min: int = 1,
    n_max: int = 10**9,
    n_start: int = 1000,
) -> Calibration:
    """Smallest n (exact, or within rtol) such that the composition meets (epsilon, delta)."""
    t0 = time.perf_counter()
    _check_common(rounds, epsilon, delta)
    Mechanism(1, k, eps0)  # validates k and eps0
    if not (0 <= rtol < 1):
        raise InvalidParameters(f"rtol must be in [0, 1), got {rtol!r}")
    if not (isinstance(n_min, int) and isinstance(n_max, int) and 1 <= n_min <= n_max):
        raise InvalidParameters("need integers 1 <= n_min <= n_max")
    ev = _Evaluator(
        lambda x: Mechanism(int(x), k, eps0), rounds, delta, spent, pld_fn, engine, grid
    )

    hi_feas, lo_inf = _bracket(
        ev, epsilon, float(n_start), float(n_min), float(n_max), feasible_below=False, integer=True
    )
    if hi_feas is None:
        raise NotApplicable(
            f"even n = {n_max} users do not meet epsilon={epsilon:g} at delta={delta:g} with "
            f"eps0={eps0:g}, k={k}, {rounds} rounds (composed bound {ev(float(n_max)):.4g})"
        )
    if lo_inf is None:
        value = int(hi_feas)
    else:
        value = int(_search(ev, epsilon, hi_feas, lo_inf, rtol=rtol, integer=True, log_x=True))
    final = ev(float(value))
    if not final <= epsilon:  # pragma: no cover - guarded by construction
        raise AssertionError("calibration returned an infeasible n")
    infeasible_below = [x for x in ev.memo if x < value and ev.memo[x] > epsilon]
    return Calibration(
        parameter="n",
        value=float(value),
        achieved_epsilon=final,
        target_epsilon=float(epsilon),
        delta=float(delta),
        rounds=rounds,
        evaluations=len(ev.memo),
        bracket=(max(infeasible_below) if infeasible_below else 0.0, float(value)),
        seconds=time.perf_counter() - t0,
        engine=engine,
        trials=sorted(ev.memo.items()),
    )


def calibrate_n(
    eps0: float,
    k: int,
    rounds: int,
    epsilon: float,
    delta: float,
    *,
    pld_fn: PldFn | None = None,
    engine: str = "dp_accounting",
    grid: float | None = None,
    spent: Sequence[Mechanism] = (),
    rtol: float = 0.0,
    n_min: int = 1,
    n_max: int = 10**9,
) -> int:
    """Smallest n such that `rounds` rounds of k-RR(eps0) (after `spent`) meet (epsilon, delta).

    The value returned was checked feasible. With rtol = 0 (default) it is the exact smallest
    integer if feasibility is monotone in n (observed, not proven); with rtol > 0 the search
    stops when the bracket is within rtol * n (fewer PLD evaluations at large n).
    Raises NotApplicable if n_max users do not suffice.
    """
    return int(
        calibrate_n_detailed(
            eps0,
            k,
            rounds,
            epsilon,
            delta,
            pld_fn=pld_fn,
            engine=engine,
            grid=grid,
            spent=spent,
            rtol=rtol,
            n_min=n_min,
            n_max=n_max,
        ).value
    )


# ----------------------------------------------------------------------------- search helpers


def _log_ratio(ev: Callable[[float], float], target: float, x: float) -> float:
    """g(x) = log(ev(x) / target): <= 0 iff the trial meets the target."""
    v = ev(x)
    if v <= 0:
        return -math.inf
    if v == math.inf:
        return math.inf
    return math.log(v) - math.log(target)


def _bracket(
    ev: Callable[[float], float],
    target: float,
    start: float,
    lo_cap: float,
    hi_cap: float,
    *,
    feasible_below: bool,
    integer: bool,
) -> tuple[float | None, float | None]:
    """(x_feas, x_inf): two evaluated trials on either side of the boundary.

    Walks from `start` towards the boundary; the step factor is predicted by a secant of
    g = log(ev/target) against log x through the last two trials (clamped to [1.25, 16]; 2 for
    the first step). x_feas is None if the cap on the feasible side still fails; x_inf is None if
    the cap on the other side still meets the target.
    """
    x = float(round(start)) if integer else float(start)
    x = min(max(x, lo_cap), hi_cap)
    gx = _log_ratio(ev, target, x)
    feas = gx <= 0
    up = feas == feasible_below  # move up when feasible below, or infeasible above
    prev: tuple[float, float] | None = None
    while True:
        f = 2.0
        if prev is not None and math.isfinite(gx) and math.isfinite(prev[1]) and gx != prev[1]:
            ux, up_ = math.log(x), math.log(prev[0])
            u_root = ux - gx * (ux - up_) / (gx - prev[1])
            dist = (u_root - ux) if up else (ux - u_root)
            if dist > 0:
                f = min(16.0, max(1.25, math.exp(1.1 * dist)))
        nxt = x * f if up else x / f
        if integer:
            nxt = float(max(round(nxt), x + 1) if up else min(round(nxt), x - 1))
        nxt = min(max(nxt, lo_cap), hi_cap)
        if nxt == x:  # at the cap
            return (x, None) if feas else (None, x)
        gn = _log_ratio(ev, target, nxt)
        if (gn <= 0) != feas:
            return (x, nxt) if feas else (nxt, x)
        prev = (x, gx)
        x, gx = nxt, gn


def _search(
    ev: Callable[[float], float],
    target: float,
    x_feas: float,
    x_inf: float,
    *,
    rtol: float,
    integer: bool,
    log_x: bool,
) -> float:
    """Shrink the bracket [x_feas (meets the target), x_inf (does not)], in either order, to
    the feasibility boundary; returns a point that was evaluated and met the target.

    Each step predicts the root of g(x) = log(ev(x) / target) against u = log x (`log_x`, for n:
    eps ~ n^-1/2) or u = x (for eps0: the composed epsilon grows roughly exponentially in eps0)
    by inverse quadratic interpolation through the bracket ends and the last replaced end
    (secant when only two points are usable) and evaluates it, nudged to the feasible side by
    0.45 rtol; once the bracket is within ~30 tolerances it evaluates two points straddling the
    prediction at +-0.45 rtol (relative; +-0.5 for integers at rtol 0), so an accurate
    prediction closes the bracket at once. When three steps did not halve the bracket (in u), a
    bisection step follows: the bracket shrinks geometrically whatever the curve.
    """

    def to_u(x: float) -> float:
        return math.log(x) if log_x else x

    def from_u(u: float) -> float:
        return math.exp(u) if log_x else u

    def done(a: float, b: float) -> bool:
        lo, hi = min(a, b), max(a, b)
        if integer:
            return hi - lo <= max(1, int(rtol * hi))
        return hi / lo - 1.0 <= rtol

    def inside(x: float, a: float, b: float) -> bool:
        return min(a, b) < x < max(a, b)

    a, b = x_feas, x_inf
    ga, gb = _log_ratio(ev, target, a), _log_ratio(ev, target, b)
    c: tuple[float, float] | None = None  # the last replaced bracket end
    bisect_next = False
    spans: list[float] = []
    while not done(a, b):
        la, lb = to_u(a), to_u(b)
        span = abs(lb - la)
        mid = from_u(0.5 * (la + lb))
        cands: list[float] = []
        if not bisect_next and math.isfinite(ga) and math.isfinite(gb) and gb != ga:
            t = -ga / (gb - ga)  # secant
            if c is not None and math.isfinite(c[1]) and c[1] not in (ga, gb):
                lc, gc = to_u(c[0]), c[1]
                u = (
                    la * gb * gc / ((ga - gb) * (ga - gc))
                    + lb * ga * gc / ((gb - ga) * (gb - gc))
                    + lc * ga * gb / ((gc - ga) * (gc - gb))
                )
                t_iqi = (u - la) / (lb - la)
                if 0.0 < t_iqi < 1.0:
                    t = t_iqi
            t = min(0.98, max(0.02, t))
            root = from_u(la + t * (lb - la))
            w = max(0.5, 0.45 * rtol * root) if integer else 0.45 * rtol * root
            d = 1.0 if b > a else -1.0
            # straddle only once the bracket is within ~30 tolerances (before, one point)
            near = (
                (abs(b - a) <= 30 * max(1.0, rtol * root))
                if integer
                else (abs(b - a) <= 30 * rtol * root)
            )
            cands = [root - d * w, root + d * w] if near else [root - d * w]
        cands.append(mid)  # used only if no straddle point fell inside
        evaluated = False
        for x in cands:
            if evaluated and x == mid:
                break
            xs = float(round(x)) if integer else x
            if not inside(xs, a, b):
                continue
            evaluated = True
            gx = _log_ratio(ev, target, xs)
            if gx <= 0:
                c = (a, ga)
                a, ga = xs, gx
            else:
                c = (b, gb)
                b, gb = xs, gx
            if done(a, b):
                break
        # bisect when three steps did not halve the bracket (superlinear steps are kept)
        spans.append(span)
        now = abs(to_u(b) - to_u(a))
        bisect_next = len(spans) >= 3 and now > 0.5 * spans[-3]
    return a
