"""`clones`: Feldman, McMillan, Talwar, "Hiding among the clones" (FOCS 2021): sound for any
eps0-LDP randomizer, hence blind to k; offered for comparison.

Their theorem: shuffling n reports of ANY eps0-LDP randomizer is (eps, delta)-DP whenever the
pair below is (eps, delta)-indistinguishable:

    C ~ Bin(n-1, e^-eps0),  A | C ~ Bin(C, 1/2),  D ~ Bern(q),  q = e^eps0 / (e^eps0 + 1),
    P = (A + D, C - A + 1 - D),   Q = (A + 1 - D, C - A + D).

This is the pair of the official implementation (apple/ml-shuffling-amplification, `onestep`
and `deltacomp`; Koskela et al. call it the "lemma pair"). C is visible in both coordinates'
sum, so given C = c it is the one-parameter clone pair of `clone_pair.clone_pair_log_delta`:
P_c = q (B+1) + (1-q) B, Q_c = (1-q) (B+1) + q B, B ~ Bin(c, 1/2). We compute its hockey-stick
EXACTLY (closed form per c, log space, rigorous bounds for the truncated c-tails), which is
never above the official code's stepped numerical upper bound (that code brackets the same
quantity). The pair is symmetric (swap the coordinates), so one direction suffices.

delta_c is non-increasing in c (B ~ Bin(c+1, 1/2) = Bin(c, 1/2) + Bern(1/2) is a common
post-processing of both sides), which bounds the truncated tails.

Not used here: the pair (5.1) of Koskela et al. (P = (A+D, C-A), Q = (A, C-A+D)), which is
looser and not eps0-bounded (see seed-002 note 2.4.4).

Closed form (option `closed_form=True`): the formula of the official code `closedformanalysis`
(valid only when eps0 <= log(n / (16 log(4/delta))); NotApplicable outside),
    a = 8 sqrt(e^eps0 log(4/delta) / n),  c = 8 e^eps0 / n,  e = log(1 + a + c),
    eps = log(1 + (1 - e^-eps0) / (1 + e^(-eps0 - e)) * (a + c)).
Its prefactor is slightly more conservative than the paper's (e^eps0-1)/(e^eps0+1). It gives
0.5378 at n = 1e5, eps0 = 4, delta = 1e-6 (the README value).

Soundness: `Soundness.SOUND_UPPER` (published theorem for every eps0-LDP randomizer, k-RR
included; checked here against the brute-force tight delta of shuffled k-RR for n <= 10). It
ignores k, so for k-RR at large eps0 it is much looser than the blanket bounds. All results are
capped by the LDP bound (`accountant.ldp`).
"""

from __future__ import annotations

import math
import time

from shufflekit.accountant.clone_pair import (
    MixtureResult,
    clone_mixture_atoms,
    clone_mixture_log_delta,
)
from shufflekit.accountant.core import (
    Mechanism,
    PrivacyLossDistribution,
    PrivacyResult,
    check_query,
)
from shufflekit.accountant.ldp import (
    Label,
    delta_result,
    epsilon_result,
    solved_epsilon_result,
)
from shufflekit.accountant.numerics.krr import krr
from shufflekit.accountant.numerics.logspace import NEG_INF
from shufflekit.accountant.numerics.roots import bisect
from shufflekit.base.errors import NotApplicable

METHOD = "clones"
SUMMARY = "Feldman-McMillan-Talwar clones pair (any eps0-LDP randomizer), exact hockey-stick"
SUMMARY_CLOSED = "Feldman-McMillan-Talwar closed form (official code's formula), validity-checked"

_EXACT = Label(METHOD, "exact hockey-stick of the Feldman-McMillan-Talwar pair (ignores k)")
_CLOSED = Label(METHOD, "Feldman-McMillan-Talwar closed form (official code's formula)")


def _q(eps0: float) -> float:
    """q of the clones pair: the keep probability of binary randomized response at eps0."""
    return krr(2, eps0).p


def _q_c(eps0: float) -> float:
    """1 - q, without cancellation (q rounds towards 1 as eps0 grows)."""
    return krr(2, eps0).one_minus_p


def clones_log_delta(
    n: int, eps0: float, epsilon: float, *, stop_below: float = NEG_INF
) -> MixtureResult:
    """log delta(epsilon) of the clones pair: rigorous upper bound and a lower estimate."""
    return clone_mixture_log_delta(
        n - 1, math.exp(-eps0), _q(eps0), epsilon, stop_below=stop_below, q_c=_q_c(eps0)
    )


def fmt_closed_form_epsilon_log(n: int, eps0: float, log_delta: float) -> float:
    """epsilon of the closed form at delta = e^log_delta; NotApplicable outside its validity."""
    log4d = math.log(4.0) - log_delta  # log(4/delta)
    if log4d <= 0 or eps0 > math.log(n / (16.0 * log4d)):
        raise NotApplicable(
            "Feldman-McMillan-Talwar closed form needs eps0 <= log(n / (16 log(4/delta))): "
            f"eps0 = {eps0:g}, n = {n}, delta = e^{log_delta:.4g}"
        )
    a = 8.0 * math.sqrt(math.exp(eps0) * log4d / n)
    c = 8.0 * math.exp(eps0) / n
    e = math.log1p(a + c)
    b = -math.expm1(-eps0)
    d = 1.0 + math.exp(-eps0 - e)
    return math.log1p(b / d * (a + c))


def _closed_form_log_delta(n: int, eps0: float, epsilon: float) -> float:
    """Smallest delta (as a log) for which the closed form certifies epsilon."""
    # validity: delta >= 4 exp(-n e^-eps0 / 16); eps_cf(delta) decreases in delta
    log_dmin = math.log(4.0) - n * math.exp(-eps0) / 16.0
    if log_dmin >= 0:
        raise NotApplicable(
            f"Feldman-McMillan-Talwar closed form is not valid for any delta < 1 at n = {n}, "
            f"eps0 = {eps0:g} (needs n > 16 e^eps0 log 4)"
        )
    hi_ld = math.log1p(-1e-12)  # delta just below 1
    if fmt_closed_form_epsilon_log(n, eps0, hi_ld) > epsilon:
        raise NotApplicable(
            f"Feldman-McMillan-Talwar closed form gives no delta < 1 at epsilon = {epsilon:g}"
        )
    lo_ld = max(log_dmin + 1e-12, -1e6)
    if fmt_closed_form_epsilon_log(n, eps0, lo_ld) <= epsilon:
        return lo_ld
    # eps_cf(lo_ld) > epsilon >= eps_cf(hi_ld)
    return bisect(
        lambda ld: fmt_closed_form_epsilon_log(n, eps0, ld) <= epsilon, lo_ld, hi_ld, rtol=1e-10
    )[1]


def clones_delta(mech: Mechanism, epsilon: float, *, closed_form: bool = False) -> PrivacyResult:
    """delta(epsilon) of the clones bound (exact pair, or `closed_form=True`), LDP-capped."""
    t0 = time.perf_counter()
    check_query(mech, epsilon)
    if closed_form:
        ld = _closed_form_log_delta(mech.n, mech.eps0, epsilon)
        return delta_result(mech, epsilon, ld, _CLOSED, t0, {"variant": "closed_form"})
    mr = clones_log_delta(mech.n, mech.eps0, epsilon)
    details = {
        "variant": "numerical",
        "lower_log_delta_of_pair": mr.lower,
        "log_truncated_tail_bound": mr.log_tail_mass,
        "c_window": mr.window,
    }
    return delta_result(mech, epsilon, mr.upper, _EXACT, t0, details)


def clones_epsilon(mech: Mechanism, delta: float, *, closed_form: bool = False) -> PrivacyResult:
    """epsilon(delta) of the clones bound (exact pair, or `closed_form=True`), LDP-capped."""
    t0 = time.perf_counter()
    check_query(mech, delta=delta)
    log_t = math.log(delta) if delta > 0 else NEG_INF
    if closed_form:
        if delta <= 0:
            raise NotApplicable("the closed form needs delta > 0")
        eps = fmt_closed_form_epsilon_log(mech.n, mech.eps0, log_t)
        return epsilon_result(mech, delta, eps, _CLOSED, t0, {"variant": "closed_form"})

    def curve(e: float) -> float:
        return clones_log_delta(mech.n, mech.eps0, e, stop_below=log_t - 5.0).upper

    return solved_epsilon_result(mech, delta, curve, _EXACT, t0, {"variant": "numerical"})


def clones_pld(
    mech: Mechanism, *, tau: float = 1e-15, grid: float | None = None
) -> PrivacyLossDistribution:
    """PLD of the clones pair (dominating pair of any eps0-LDP shuffle; NOT LDP-capped).

    Truncated mass (C outside a window, B outside its window per c) is counted as infinite
    loss. With `grid`, losses are rounded up to multiples of it and merged (pessimistic).
    """
    check_query(mech)
    n, eps0 = mech.n, mech.eps0
    acc = clone_mixture_atoms(n - 1, math.exp(-eps0), _q(eps0), tau=tau, grid=grid, q_c=_q_c(eps0))
    return acc.build(
        f"Feldman-McMillan-Talwar clones pair, n={n}, eps0={eps0:g}"
        + (f", losses rounded up to a {acc.step:g} grid" if acc.step else "")
        + "; truncated mass counted as infinite loss"
    )
