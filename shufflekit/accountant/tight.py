"""`tight`: the accountant's default bound for one round of shuffled k-RR, with its gap stated:
the sound upper bound and the best exact attack, searched together for epsilon at a delta.

Setting: n users, each applies k-RR(eps0) over k values (keep the true value with probability
p = e^eps0/(e^eps0+k-1), report each other value with probability q = 1/(e^eps0+k-1)); a uniform
shuffle releases the histogram. Replace-one adjacency (the target holds x0 or x1); the adversary
knows every other user's value but not their coins. The quantity bounded is the tight
    delta(eps) = sup over the others' values and ordered pairs (x0, x1) of
                 H_{e^eps}(P_x0 || P_x1)  (hockey-stick divergence of the histogram laws).

Upper bound (sound; `log_delta`, `epsilon`): the privacy blanket with the other users' blanket
bits revealed (`accountant.tight_upper`), capped by the LDP bound (eps0, 0): delta(eps) = 0 for
eps >= eps0. Lower bound (`lower_log_delta`, `lower_epsilon`): the exact delta of the worst of
several explicit datasets (`accountant.attack`), reported in `details["worst_dataset"]`.
Every log delta of an upper bound is increased by a relative safety margin of 1e-7 (the
evaluation is accurate to ~1e-9 relative); every lower bound is decreased by it.

k = 2 (n <= 1e9): the family "m others at x0, the rest at x1" is every dataset, so the tight
delta is its maximum over m. `accountant.tight_k2` certifies it from both sides by branch and
bound over intervals of m (an interval is bounded by revealing the blanket bits of its middle
users only); the upper bound used is the smaller of that and the blanket bound, and its best
exact dataset joins the lower bounds. Measured gap: ~0.1% in epsilon up to 2e6, 0.3-0.5% up to
1e8, 0.4-1.4% at 1e9 in 1-8 s (the tolerance in delta follows the curve's slope there; the
blanket alone: 10-30%). Across rounds see
`k2_compose` (n <= 1e9 too). Lower bounds ignore dropped mass (never add it).

The PLDs (`tight_pld`, `attack_pld`) are for composition over rounds by a separate engine; see
their docstrings for the discretisation (losses rounded UP for the upper bound, DOWN for the
attack, both monotone in the composed delta and hence sound in their direction).
"""

from __future__ import annotations

import math
import time
from typing import Any, Unpack

import numpy as np

from shufflekit.accountant.attack import attack_log_delta
from shufflekit.accountant.attack_pld import (
    LOG_TAU,
    Z_BINS,
    AttackPldOptions,
    check_options,
    dataset_pld,
)
from shufflekit.accountant.core import (
    Mechanism,
    PrivacyLossDistribution,
    PrivacyResult,
    check_delta,
    check_epsilon,
    check_query,
)
from shufflekit.accountant.ldp import Label
from shufflekit.accountant.numerics.krr import log_ldp_delta
from shufflekit.accountant.numerics.roots import newton_root
from shufflekit.accountant.tight_k2 import K2Bound, k2_bounds
from shufflekit.accountant.tight_upper import (
    N_MAX,
    SAFETY,
    BlanketGrid,
    TooBigError,
    blanket_eval,
    blanket_grid,
    check_supported,
    thinned,
    tight_pld,
    upper_bound,
    upper_log_delta,
)
from shufflekit.base.checks import real
from shufflekit.base.errors import AccuracyError, InvalidParameters, UnsoundResult

__all__ = [
    "attack_log_delta",
    "attack_pld",
    "tight_delta",
    "tight_epsilon",
    "tight_pld",
    "upper_log_delta",
]

METHOD = "tight"
_LABEL = Label(METHOD, "")  # a sound upper bound; each result's note says how it was obtained
_K2_MAX_N = N_MAX  # k = 2: certified branch and bound wherever `tight` answers (~10 s at 1e9)


# ----------------------------------------------------------------------------- k = 2
_K2_NOTE = (
    "k = 2: max over every dataset (m others at x0) by branch and bound, certified, and the"
    " blanket bound, whichever is smaller"
)


def _k2_rtol(mech: Mechanism, log_slope: float | None = None) -> float:
    """Branch-and-bound tolerance in delta: 1% up to 2e6 users; above, where every leaf costs
    more (~0.1 s at 1e9), 3%, or with `log_slope` (d log delta / d log epsilon near the
    answer) what keeps epsilon within 0.5% (1% above 1e8 users): looser in delta where the
    curve is steep (delta = 1e-12: up to 25%), tighter where it is flat (tiny eps0: ~0.5%)."""
    if mech.n <= 2_000_000:
        return 0.01
    if log_slope is None or not math.isfinite(log_slope) or log_slope == 0.0:
        return 0.03
    share = 0.005 if mech.n <= 100_000_000 else 0.01
    return min(0.25, max(0.005, math.expm1(share * abs(log_slope))))


def _k2(mech: Mechanism, eps: float, *, rtol: float) -> K2Bound | None:
    """The certified k = 2 bound where it applies (k = 2, n <= _K2_MAX_N), else None."""
    if mech.k != 2 or mech.n > _K2_MAX_N or eps >= mech.eps0:
        return None
    return k2_bounds(mech, eps, rtol=rtol)[0]


def _k2_details(mech: Mechanism, k2: K2Bound | None) -> dict[str, Any]:
    if k2 is None:
        why = f"n > {_K2_MAX_N}" if mech.n > _K2_MAX_N else "not needed (no amplification)"
        return {"k2_certified": False, "k2_note": f"k = 2 branch and bound not run: {why}"}
    return {
        "k2_certified": k2.converged,
        "k2_worst_m": k2.worst_m,
        "k2_evaluations": k2.evaluations,
        "k2_log_upper": k2.log_upper,
        "k2_log_lower": k2.log_lower,
    }


#: How far below the Newton search's answer `_k2_epsilon` checks that nothing is certified.
K2_CHECK = 0.002


def _k2_epsilon(
    mech: Mechanism, ld: float, eps_l: float, hi: float, rtol: float, slope: float
) -> tuple[float, dict[str, Any]]:
    """Smallest epsilon (rounded up) where the certified k = 2 bound is <= e^ld.

    Starts just above the attack's epsilon (the k = 2 bound is usually within a fraction of a
    percent of it) and carries the branch-and-bound partition from one epsilon to the next.
    Each branch and bound only decides (`target`): it stops once its upper bound is below the
    target or an exact dataset is above it, so its values are not quite a function a secant
    can follow, and the Newton search can stop where the cheapest bound crosses the target
    (n=198, k=2, eps0=0.671, delta=4.3e-4: 0.1054 for a root near 0.1015). So the answer is
    checked K2_CHECK below; if that is certified too, a bisection on the sign each probe
    decides (an undecided probe counts as not certified) finds the smallest to rtol.
    """
    cuts: list[int] | None = None
    bounds: dict[float, K2Bound] = {}  # by epsilon evaluated
    k2_rtol = _k2_rtol(mech, slope * eps_l)
    target = ld - SAFETY

    def decide(x: float) -> K2Bound:
        nonlocal cuts
        res, cuts = k2_bounds(mech, min(x, hi), rtol=k2_rtol, cuts=cuts, target=target)
        bounds[x] = res
        return res

    def fg(x: float) -> tuple[float, float | None]:  # the root only needs the sign at each x
        return decide(x).log_upper - target, None

    x, evals = newton_root(fg, eps_l * (1 + 10 * rtol), slope, hi, rtol, "up")
    at_x = bounds.get(x, list(bounds.values())[-1])  # the evaluation that certified x
    if x < hi and (probe := x * (1 - K2_CHECK)) > eps_l:
        evals += 1
        if (res := decide(probe)).log_upper <= target:  # stopped early: bisect below it
            x, at_x = probe, res
            low = max([eps_l, *(e for e, r in bounds.items() if r.log_upper > target and e < x)])
            while x - low > 0.5 * rtol * x:
                mid = 0.5 * (low + x)
                evals += 1
                if (res := decide(mid)).log_upper <= target:
                    x, at_x = mid, res
                else:
                    low = mid
    return x, _k2_details(mech, at_x) | {"k2_epsilon_evaluations": evals}


# ----------------------------------------------------------------------------- public API
def tight_delta(mech: Mechanism, epsilon: float) -> PrivacyResult:
    """Tight delta(epsilon) of one round: sound upper bound and best exact attack."""
    check_query(mech)
    eps = check_epsilon(epsilon)  # None too: check_query takes None for "not asked"
    check_supported(mech)  # after the input: a NaN is a mistake whatever n is
    t0 = time.perf_counter()
    if eps >= mech.eps0:
        note = "epsilon >= eps0: delta = 0 by the LDP bound of k-RR"
        return _LABEL.result(eps, -math.inf, t0, {"capped_by_ldp": True}, note, (eps, -math.inf))
    up, drop, nb, limited = upper_bound(mech, eps)
    up = min(up, _ldp_cap(mech, eps))
    t1 = time.perf_counter()
    deep = limited or up < -690.0  # delta far below 1e-300: keep the attack cheap
    low, worst, cands = attack_log_delta(mech, eps, log_tau=min(-60.0, up - 30.0), cheap=deep)
    upper_note = "blanket with the others' blanket bits revealed"
    k2 = _k2(mech, eps, rtol=_k2_rtol(mech))
    if k2 is not None:
        up = min(up, k2.log_upper + SAFETY)
        if k2.log_lower - SAFETY > low:
            low = k2.log_lower - SAFETY
            worst = f"{k2.worst_m} others at x0, {mech.n - 1 - k2.worst_m} at x1"
        upper_note = _K2_NOTE
    note = f"upper: {upper_note}; lower: {worst}"
    if limited and k2 is None:
        note += (
            "; the upper bound is truncation-limited (sound but possibly loose: no truncation"
            " the grid budget allows is negligible beside the rest of the bound here)"
        )
    t2 = time.perf_counter()
    if low > up:
        raise UnsoundResult(
            f"tight: attack log delta {low!r} exceeds the upper bound {up!r} at n={mech.n}, "
            f"k={mech.k}, eps0={mech.eps0!r}, epsilon={eps!r}: an upper bound below its own "
            "lower bound is never output"
        )
    details: dict[str, Any] = {
        "worst_dataset": worst,
        "attack_log_deltas": cands,
        "log_truncated_mass": drop,
        "blanket_buckets": nb,
        "truncation_limited": limited,
        "seconds_upper": t1 - t0,
        "seconds_lower": t2 - t1,
        "capped_by_ldp": False,
    }
    if mech.k == 2:
        details |= _k2_details(mech, k2)
    return _LABEL.result(eps, up, t0, details, note, (eps, low))


def _ldp_cap(mech: Mechanism, eps: float) -> float:
    """log of k-RR's own delta(eps) with the margin, which bounds every dataset's after the
    shuffle (post-processing), and never above delta = 1 (the margin must not pass it)."""
    return min(log_ldp_delta(mech.krr, eps) + SAFETY, 0.0)


def _ldp_epsilon(mech: Mechanism, log_delta: float) -> float:
    """Smallest float epsilon (up to a few ulps, rounded up) where k-RR's own delta,
    p (1 - e^(eps - eps0)), is <= delta: a sound epsilon by post-processing."""
    rr = mech.krr
    ratio = math.exp(log_delta) / rr.p
    if ratio >= 1.0:
        return 0.0
    x = max(0.0, mech.eps0 + math.log1p(-ratio) * (1.0 - 1e-12))
    for _ in range(64):
        if x >= mech.eps0 or log_ldp_delta(rr, x) + SAFETY <= log_delta:
            return min(x, mech.eps0)
        x = math.nextafter(x, math.inf)
    return mech.eps0


def _guess_epsilon(mech: Mechanism, log_delta: float) -> float:
    """Rough CLT guess of the blanket epsilon, only used to start the bracket search."""
    g = mech.krr.gamma
    nb = max((mech.n - 1) * g, 1.0)
    return min(mech.eps0, (1 - g) * math.sqrt(4 * mech.k * max(-log_delta, 1.0) / nb) + 1e-6)


def tight_epsilon(mech: Mechanism, delta: float, *, rtol: float = 1e-5) -> PrivacyResult:
    """Smallest epsilon with delta(epsilon) <= delta: sound upper bound and attack lower bound.

    `epsilon` is rounded UP (delta_upper(epsilon) <= delta is verified at the returned point),
    `lower_epsilon` DOWN (the attack's delta at it is >= delta), each to relative `rtol`.
    """
    check_query(mech)
    delta = check_delta(delta)
    rtol = real("rtol", rtol, 0, 0.1, low_open=True, high_open=True, error=InvalidParameters)
    check_supported(mech)  # after the input: a NaN is a mistake whatever n is
    t0 = time.perf_counter()
    ld = math.log(float(delta))
    eps0 = mech.eps0
    top = eps0 * (1.0 - 1e-12)
    hint = ld
    g = mech.krr.gamma
    log_tau = min(-30.0, ld - 16.0)

    # ---- upper: grids (windows and buckets independent of eps), evaluated along the search:
    # a coarse grid (4x wider buckets, `thinned` in T) locates the root, the fine grid certifies
    # it in ~2 steps
    try:
        coarse = blanket_grid(mech, log_tau, hint, bucket_scale=4.0)
        grid = blanket_grid(mech, log_tau, hint)
    except TooBigError:
        raise AccuracyError(
            f"tight: the blanket bound at n={mech.n}, k={mech.k}, eps0={mech.eps0}, "
            f"delta={delta} needs more terms than the evaluation budget"
        ) from None

    if grid.log_dropped + SAFETY > ld - 9.0:
        raise AccuracyError("tight: truncation could not be made negligible against delta")
    n_eval = [0]

    last_slope = [-1.0]

    def fg_on(gr: BlanketGrid) -> Any:
        def fg_upper(x: float) -> tuple[float, float | None]:
            n_eval[0] += 1
            body, ptail = blanket_eval(mech, gr, x)
            total = float(np.logaddexp(body, gr.log_dropped))
            if body == -math.inf:
                return total + SAFETY - ld, None
            # d log delta / d eps = -(P(L > eps) - delta_body) / delta_total
            diff = math.exp(ptail - total) - math.exp(body - total)
            if diff > 0:
                last_slope[0] = -diff
            return total + SAFETY - ld, (-diff if diff > 0 else None)

        return fg_upper

    locate = thinned(coarse)
    if locate is coarse and coarse.n_buckets == grid.n_buckets:  # the same grid: one search
        eps_c = _guess_epsilon(mech, ld)
    else:
        eps_c, _ = newton_root(fg_on(locate), _guess_epsilon(mech, ld), -1.0, top, rtol, "up")
    eps_u, _ = newton_root(fg_on(grid), min(eps_c, top), last_slope[0], top, rtol, "up")
    if eps_u >= top:
        eps_u = eps0  # no amplification at this delta: the LDP bound
    eps_u = min(eps_u, _ldp_epsilon(mech, ld))
    t1 = time.perf_counter()

    # ---- lower: best attack, started at the upper bound with its slope
    seen: dict[float, str] = {}
    n_low = [0]

    with_z: list[bool] = []  # whether the first evaluation could afford "all others at z"

    def fg_lower(x: float) -> tuple[float, float | None]:
        # the same datasets at every step (a root search on a function that changes shape
        # when an attack drops out of its budget wanders)
        n_low[0] += 1
        tau = min(-40.0, ld - 20.0)
        if not with_z:
            val, name, cands = attack_log_delta(mech, x, log_tau=tau)
            with_z.append("all others at z" in cands)
        else:
            # (within its budget "all others at z" is always there: exact, or without h_z)
            val, name, _ = attack_log_delta(mech, x, log_tau=tau, cheap=not with_z[0])
        seen[x] = name
        return val - ld, None

    if eps_u <= 0:
        eps_l = 0.0
    else:
        # verified at eps_l (the attack's delta there is >= delta): never rounded up to eps0
        eps_l, _ = newton_root(fg_lower, min(eps_u, top), last_slope[0], top, rtol, "down")
    if eps_l >= top:
        worst = "p^n > delta: the LDP bound is attained (no amplification)"
    else:
        worst = seen.get(eps_l) or attack_log_delta(mech, eps_l)[1]
    k2_note: dict[str, Any] = {}
    if mech.k == 2 and mech.n <= _K2_MAX_N and 0 < eps_l < eps0:
        k2_hi = min(eps_u, top)
        eps_k2, k2_note = _k2_epsilon(mech, ld, eps_l, k2_hi, rtol, last_slope[0])
        if eps_k2 < k2_hi:  # certified (the search returns its end when it finds no root)
            eps_u = eps_k2
    t2 = time.perf_counter()
    if eps_l > eps_u:
        raise UnsoundResult(
            f"tight: attack epsilon {eps_l} exceeds the upper bound {eps_u} at n={mech.n}, "
            f"k={mech.k}, eps0={mech.eps0}, delta={delta}: an upper bound below its own lower "
            "bound is never output"
        )
    details: dict[str, Any] = {
        "worst_dataset": worst,
        "log_truncated_mass": grid.log_dropped,
        "blanket_buckets": grid.n_buckets,
        "blanket_elements": int(grid.t.size),
        "upper_evaluations": n_eval[0],
        "lower_evaluations": n_low[0],
        "seconds_upper": t1 - t0,
        "seconds_lower": t2 - t1,
        "rtol": rtol,
        "relative_gap": (eps_u - eps_l) / eps_l if eps_l > 0 else math.inf,
        "gamma": g,
    }
    upper_note = "blanket with the others' blanket bits revealed"
    if mech.k == 2:
        details |= k2_note or _k2_details(mech, None)
        upper_note = _K2_NOTE if k2_note else upper_note
    note = f"upper: {upper_note}; lower: {worst}"
    return _LABEL.result(eps_u, ld, t0, details, note, (eps_l, ld))


def attack_pld(
    mech: Mechanism,
    *,
    dataset: str = "auto",
    direction: str = "x0|x1",
    m: int | None = None,
    ref_delta: float = 1e-6,
    **options: Unpack[AttackPldOptions],
) -> PrivacyLossDistribution:
    """PLD of an explicit worst-case dataset (`attack_pld.dataset_pld`): composing it gives a
    LOWER bound. dataset="auto" picks the dataset whose exact delta is largest at the attack
    epsilon of `tight_epsilon(mech, ref_delta)` (small-n dense families are not offered here),
    with its direction; any other value is passed on with `direction`, `m` and `options`
    (`AttackPldOptions`: loss_step, n_atoms, log_tau, z_bins)."""
    check_query(mech)
    check_options(direction, options.get("log_tau", LOG_TAU), options.get("z_bins", Z_BINS))
    if dataset == "auto":
        res = tight_epsilon(mech, ref_delta)
        eps_ref = min(res.lower_epsilon or 0.0, mech.eps0 * (1 - 1e-9))
        cands = attack_log_delta(mech, eps_ref, every=True)[2]
        choices: dict[str, tuple[str, bool, int | None]] = {
            "all others at x0 (x0|x1)": ("all_at_x0", False, None),
            "all others at x1 (x0|x1)": ("all_at_x0", True, None),
            "all others at x0, event 'all n reports x0'": ("all_at_x0", False, None),
        }
        if mech.k >= 3:
            choices["all others at z"] = ("all_at_z", False, None)
        best_val = -math.inf
        choice: tuple[str, bool, int | None] = ("all_at_x0", False, None)
        for name, val in cands.items():
            if name in choices and val > best_val:
                best_val, choice = val, choices[name]
            elif mech.k == 2 and name.split(" ")[0].isdigit() and val > best_val:
                best_val, choice = val, ("k2_m", False, int(name.split(" ")[0]))
        dataset, reverse, m = choice
        direction = "x1|x0" if reverse else "x0|x1"
    return dataset_pld(mech, dataset=dataset, direction=direction, m=m, **options)
