"""Root finding, once for the whole accountant: epsilon for a target delta on a decreasing
log-delta curve (rounded to the safe side), bisection, and the bracket-and-shrink search for
the boundary of a monotone feasibility test (calibration).

- `solve_epsilon`: bracket by doubling steps, Brent's method, outward rounding; for curves
  that are cheap to evaluate (the published bounds).
- `newton_root`: safeguarded Newton / secant from a good starting point with derivatives; for
  curves that are expensive to evaluate (`tight`, the k = 2 certifier).
- `bisect`: a monotone predicate's switching point, to a relative tolerance or for a fixed
  number of halvings.
- `bracket_boundary` / `shrink_bracket`: the boundary of a monotone feasibility test, by
  extrapolated steps and inverse quadratic interpolation safeguarded by bisection.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from scipy import optimize

from shufflekit.base.errors import AccuracyError, InvalidParameters


def solve_epsilon(
    log_delta: Callable[[float], float],
    log_target: float,
    lo: float,
    hi: float,
    *,
    side: str = "upper",
    xtol: float = 1e-9,
    rtol: float = 1e-5,
) -> tuple[float, bool]:
    """eps in [lo, hi] where log_delta(eps) crosses log_target, rounded outward.

    Returns (eps, crossed). side="upper" (sound upper-bound curves): log_delta(eps) <= target
    at the returned eps, which is within ~xtol of the crossing; `crossed` is False when the
    curve is still above the target at `hi` (then eps = hi). Accuracy: xtol + rtol * eps.
    side="lower" (lower-bound
    curves): log_delta(eps) >= target at the returned eps; `crossed` False when the curve is
    above the target up to `hi`.
    The bracket is found by doubling steps from `lo` (targets usually sit far below `hi`, where
    tiny deltas are the most expensive to evaluate), then refined by Brent's method.
    """
    floor = -1e300
    cache: dict[float, float] = {}

    def f(e: float) -> float:
        if e not in cache:
            cache[e] = max(log_delta(e), floor) - log_target
        return cache[e]

    def below(v: float) -> bool:  # the "small delta" side of the target
        return v <= 0 if side == "upper" else v < 0

    if below(f(lo)):
        return lo, True
    a = lo
    step = (hi - lo) / 64.0
    b = min(lo + step, hi)
    while not below(f(b)):
        if b >= hi:
            return hi, False
        a = b
        step *= 2.0
        b = min(lo + step, hi)
    try:
        root = float(optimize.brentq(f, a, b, xtol=0.25 * xtol, rtol=0.25 * rtol))
    except (ValueError, RuntimeError) as exc:  # a NaN curve, or no convergence in 100 steps
        raise AccuracyError(f"epsilon search failed in [{a:g}, {b:g}]: {exc}") from exc
    # outward rounding: step away from the root until the point is on the safe side
    step = 0.5 * (xtol + rtol * abs(root))
    if side == "upper":
        x = min(root + step, b)
        while x < b and f(x) > 0:
            step *= 2.0
            x = min(root + step, b)
        return x, True
    x = max(root - step, a)
    while x > a and f(x) < 0:
        step *= 2.0
        x = max(root - step, a)
    return x, True


def newton_root(
    fg: Callable[[float], tuple[float, float | None]],
    x0: float,
    slope0: float,
    hi: float,
    rtol: float,
    side: str,
) -> tuple[float, int]:
    """Root of a decreasing f on (0, hi], safeguarded Newton / secant from x0.

    fg(x) -> (f(x), f'(x) or None). Returns (x, #evaluations) with, for side="up", f(x) <= 0
    verified and x within ~rtol of the root from above; side="down": f(x) >= 0 verified, from
    below. Returns x = hi if f(hi) > 0 (side "up") or f(hi) >= 0 (side "down"); x = 0 if f
    stays <= 0 down to 1e-12 (side "up") or f < 0 there (side "down").
    """
    a, b = 0.0, hi  # f(a) > 0 >= f(b) once known
    a_ok = b_ok = False
    x = min(max(x0, 1e-12), hi)
    slope = slope0
    prev: tuple[float, float] | None = None
    evals = 0
    for _ in range(100):
        fx, dx = fg(x)
        evals += 1
        if fx > 0:
            a, a_ok = x, True
        else:
            b, b_ok = x, True
        if dx is not None and dx < 0:
            slope = dx
        elif prev is not None and prev[0] != x and (fx - prev[1]) < 0:
            slope = (fx - prev[1]) / (x - prev[0])
        prev = (x, fx)
        step = -fx / slope if slope < 0 else math.inf
        if a_ok and b_ok and (b - a) <= 0.5 * rtol * b:
            break
        # a tiny Newton step only means convergence near the root: close to eps0, log delta
        # falls without bound and a huge slope makes the step tiny far from the root
        if abs(step) <= 0.25 * rtol * x and (a_ok or b_ok) and abs(fx) < 0.1:
            # converged: place the answer on the requested side with a small margin
            cand = x + step + (0.5 * rtol * x if side == "up" else -0.5 * rtol * x)
            if cand >= hi:  # the root lies at or beyond the range's end
                if x >= hi:
                    return hi, evals
                cand = hi
            if side == "up" and b_ok and cand >= b:
                cand = b
            if side == "down" and a_ok and cand <= a:
                cand = a
            if (side == "up" and cand == b and b_ok) or (side == "down" and cand == a and a_ok):
                return cand, evals
            fc, _ = fg(cand)
            evals += 1
            if (side == "up" and fc <= 0) or (side == "down" and fc >= 0):
                return cand, evals
            if fc > 0:
                a, a_ok = cand, True
            else:
                b, b_ok = cand, True
            x = 0.5 * (a + b) if (a_ok and b_ok) else cand
            continue
        xn = x + step
        if a_ok and b_ok:
            if not (a < xn < b):
                xn = 0.5 * (a + b)
        elif a_ok:  # root above a: move up, at least x1.001, at most x1.6 per step
            if not (x * 1.001 <= xn <= 1.6 * x):
                xn = min(1.6 * x, hi) if xn > 1.6 * x else min(1.001 * x, hi)
            if x >= hi:
                return hi, evals
        else:  # root below b: move down, at least /1.001, at most /1.6 per step
            if not (x / 1.6 <= xn <= x / 1.001):
                xn = x / 1.6 if xn < x / 1.6 else x / 1.001
            if xn < 1e-12:
                f0, _ = fg(0.0)
                evals += 1
                if (side == "up" and f0 <= 0) or (side == "down" and f0 < 0):
                    return 0.0, evals
                a, a_ok = 0.0, True
                xn = 0.5 * x
        x = min(xn, hi)
    if side == "up":
        if not b_ok:
            raise AccuracyError("epsilon search did not converge")
        return b, evals
    if not a_ok:
        raise AccuracyError("epsilon search did not converge")
    return a, evals


def bisect(
    pred: Callable[[float], bool],
    lo: float,
    hi: float,
    *,
    rtol: float | None = None,
    iterations: int | None = None,
) -> tuple[float, float]:
    """(lo, hi) shrunk by halving, keeping pred(lo) False and pred(hi) True (both assumed at the
    start), until hi - lo <= rtol * max(1, |hi|) or after `iterations` halvings."""
    if (rtol is None) == (iterations is None):
        raise InvalidParameters("bisect needs exactly one of rtol and iterations")
    limit = -1 if iterations is None else iterations
    i = 0
    while i != limit and (rtol is None or hi - lo > rtol * max(1.0, abs(hi))):
        mid = 0.5 * (lo + hi)
        if pred(mid):
            hi = mid
        else:
            lo = mid
        i += 1
    return lo, hi


# ----------------------------------------------------------------------------- boundary search


def _log_ratio(ev: Callable[[float], float], target: float, x: float) -> float:
    """g(x) = log(ev(x) / target): <= 0 iff the trial meets the target."""
    v = ev(x)
    if v <= 0:
        return -math.inf
    if v == math.inf:
        return math.inf
    return math.log(v) - math.log(target)


def bracket_boundary(
    ev: Callable[[float], float],
    target: float,
    start: float,
    lo_cap: float,
    hi_cap: float,
    *,
    feasible_below: bool,
    integer: bool,
    first_step: float = 2.0,
) -> tuple[float | None, float | None]:
    """(x_feas, x_inf): two evaluated trials on either side of the boundary.

    Walks from `start` towards the boundary; the step factor is predicted by a secant of
    g = log(ev/target) against log x through the last two trials (clamped to [1.25, 16];
    `first_step` for the first, small when the start is a good guess). x_feas is None if the
    cap on the feasible side still fails; x_inf is None if the cap on the other side still
    meets the target.
    """
    x = float(round(start)) if integer else float(start)
    x = min(max(x, lo_cap), hi_cap)
    gx = _log_ratio(ev, target, x)
    feas = gx <= 0
    up = feas == feasible_below  # move up when feasible below, or infeasible above
    prev: tuple[float, float] | None = None
    while True:
        f = first_step if prev is None else 2.0
        if prev is not None and math.isfinite(gx) and math.isfinite(prev[1]) and gx != prev[1]:
            ux, up_ = math.log(x), math.log(prev[0])
            u_root = ux - gx * (ux - up_) / (gx - prev[1])
            dist = (u_root - ux) if up else (ux - u_root)
            if dist > 0:
                f = max(1.25, math.exp(min(1.1 * dist, math.log(16.0))))  # no overflow
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


def shrink_bracket(
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
