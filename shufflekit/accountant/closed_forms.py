"""Closed-form amplification bounds (Erlingsson et al., Balle et al.), each only inside the
validity range of its theorem: the quick published formulas, for comparison.

`erlingsson`: Erlingsson, Feldman, Mironov, Raghunathan, Talwar, Thakurta, "Amplification by
shuffling" (SODA 2019). For any eps0-LDP randomizer with eps0 < 1/2, n >= 1000 and
delta < 1/100, the shuffled output is (eps, delta)-DP with

    eps = 12 eps0 sqrt(log(1/delta) / n),   i.e.   delta(eps) = exp(-n eps^2 / (144 eps0^2)).

Constants: the seed-002 note flags them as recalled from the paper, not from a seed. They are
corroborated by (i) Biswas et al.'s Table 1, column [10] (seed 000): this formula at n = 100,
eps0 = 0.5 gives 0.9726 / 0.8948 / 0.7788 / 0.6412 for eps = 0.1..0.4, printed (truncated) as
0.97 / 0.89 / 0.77 / 0.64 (note: n = 100 is OUTSIDE the range, Biswas et al. applied it
anyway); (ii) the public `Erlingsson` bound class of Balle et al.'s amplification code, which
uses the same formula and range (eps0 <= 0.5, n >= 1000, delta <= 0.01).

`balle-closed`: Balle, Bell, Gascon, Nissim, "The privacy blanket of the shuffle model"
(CRYPTO 2019), Theorem 3.1, as quoted in Koskela et al. (seed 002, section 4): shuffled k-RR
with blanket probability gamma is (eps, delta)-DP for eps <= 1 when

    gamma = max{ 14 k log(2/delta) / ((n-1) eps^2),  27 k / ((n-1) eps) }.

More blanket noise is a post-processing, so any gamma >= that max works; inverted for our gamma:
    eps(delta) = max{ sqrt(14 k log(2/delta) / ((n-1) gamma)), 27 k / ((n-1) gamma) }  (<= 1),
    delta(eps) = 2 exp(-(n-1) gamma eps^2 / (14 k))  for 27 k/((n-1) gamma) <= eps <= 1.

Outside their ranges both RAISE `NotApplicable` (never a silent extrapolation). The optional
`check_validity=False` evaluates the formula anyway, for reproducing papers that did so; such a
result is labelled `Soundness.NOT_A_GUARANTEE`. Inside the ranges the results are
`Soundness.SOUND_UPPER` (published theorems; their ranges start far beyond the n <= 10 of the
brute-force oracle, so they are checked against the exact pairs they relax instead). Results
are capped by the LDP bound.
"""

from __future__ import annotations

import math
import time

from shufflekit.accountant.core import Mechanism, PrivacyResult, Soundness, check_query
from shufflekit.accountant.ldp import Label, delta_result, epsilon_result
from shufflekit.accountant.numerics.logspace import NEG_INF, exp_of
from shufflekit.base.errors import NotApplicable

ERLINGSSON = "erlingsson"
BALLE = "balle-closed"
SUMMARY_ERLINGSSON = "Erlingsson et al. 2019 closed form (eps0 < 1/2, n >= 1000, delta < 1/100)"
SUMMARY_BALLE = "Balle et al. 2019 privacy blanket Thm 3.1 closed form (eps <= 1)"

_OUTSIDE = "formula evaluated OUTSIDE the theorem's validity range: not a guarantee"


# ----------------------------------------------------------------------------- Erlingsson


def _erlingsson_violations(mech: Mechanism, delta: float | None) -> list[str]:
    bad = []
    if not mech.eps0 < 0.5:
        bad.append(f"eps0 = {mech.eps0:g} is not < 1/2")
    if mech.n < 1000:
        bad.append(f"n = {mech.n} is not >= 1000")
    if delta is not None and not delta < 0.01:
        bad.append(f"delta = {delta:g} is not < 1/100")
    return bad


def erlingsson_epsilon(
    mech: Mechanism, delta: float, *, check_validity: bool = True
) -> PrivacyResult:
    """eps = 12 eps0 sqrt(log(1/delta)/n); NotApplicable outside eps0<1/2, n>=1000, delta<1/100."""
    t0 = time.perf_counter()
    check_query(mech, delta=delta)
    if delta <= 0:
        raise NotApplicable("Erlingsson et al.'s bound needs delta > 0")
    bad = _erlingsson_violations(mech, delta)
    label = _label(ERLINGSSON, bad, check_validity)
    eps = 12.0 * mech.eps0 * math.sqrt(math.log(1.0 / delta) / mech.n)
    return epsilon_result(mech, delta, eps, label, t0, {"validity_violations": bad})


def erlingsson_delta(
    mech: Mechanism, epsilon: float, *, check_validity: bool = True
) -> PrivacyResult:
    """delta = exp(-n eps^2 / (144 eps0^2)); NotApplicable outside the theorem's range."""
    t0 = time.perf_counter()
    check_query(mech, epsilon)
    log_delta = -mech.n * epsilon**2 / (144.0 * mech.eps0**2)
    delta = exp_of(log_delta)
    bad = _erlingsson_violations(mech, None)
    if not log_delta < math.log(0.01):
        bad.append(f"the resulting delta = {delta:g} is not < 1/100")
    label = _label(ERLINGSSON, bad, check_validity)
    return delta_result(mech, epsilon, log_delta, label, t0, {"validity_violations": bad})


# ----------------------------------------------------------------------------- Balle et al.


def balle_epsilon(mech: Mechanism, delta: float, *, check_validity: bool = True) -> PrivacyResult:
    """Balle et al. Thm 3.1 inverted at the mechanism's gamma; NotApplicable when eps > 1."""
    t0 = time.perf_counter()
    check_query(mech, delta=delta)
    if delta <= 0:
        raise NotApplicable("Balle et al.'s Theorem 3.1 needs delta > 0")
    if mech.n < 2:
        raise NotApplicable("Balle et al.'s Theorem 3.1 needs n >= 2")
    g, k, m = mech.gamma, mech.k, mech.n - 1
    eps = max(math.sqrt(14.0 * k * math.log(2.0 / delta) / (m * g)), 27.0 * k / (m * g))
    bad = [] if eps <= 1.0 else [f"the resulting eps = {eps:.4g} is not <= 1"]
    label = _label(BALLE, bad, check_validity)
    return epsilon_result(mech, delta, eps, label, t0, {"gamma": g, "validity_violations": bad})


def balle_delta(mech: Mechanism, epsilon: float, *, check_validity: bool = True) -> PrivacyResult:
    """delta = 2 exp(-(n-1) gamma eps^2 / (14 k)) for 27k/((n-1) gamma) <= eps <= 1."""
    t0 = time.perf_counter()
    check_query(mech, epsilon)
    if mech.n < 2:
        raise NotApplicable("Balle et al.'s Theorem 3.1 needs n >= 2")
    g, k, m = mech.gamma, mech.k, mech.n - 1
    bad = []
    if epsilon > 1.0:
        bad.append(f"eps = {epsilon:g} is not <= 1")
    e_min = 27.0 * k / (m * g)
    if epsilon < e_min:
        bad.append(f"eps = {epsilon:g} is below 27 k / ((n-1) gamma) = {e_min:.4g}")
    label = _label(BALLE, bad, check_validity)
    log_delta = min(0.0, math.log(2.0) - m * g * epsilon**2 / (14.0 * k)) if epsilon > 0 else 0.0
    log_delta = log_delta if math.isfinite(log_delta) else NEG_INF
    return delta_result(
        mech, epsilon, log_delta, label, t0, {"gamma": g, "validity_violations": bad}
    )


# ----------------------------------------------------------------------------- shared

_THEOREM = {ERLINGSSON: "Erlingsson et al. 2019 bound", BALLE: "Balle et al. 2019 Theorem 3.1"}
_NOTE = {ERLINGSSON: "Erlingsson et al. 2019 closed form", BALLE: f"{_THEOREM[BALLE]} closed form"}


def _label(method: str, bad: list[str], check_validity: bool) -> Label:
    """The result's label: NotApplicable when conditions of the theorem (`bad`) fail and the
    validity is checked, a non-guarantee when it is not, a sound upper bound otherwise."""
    if bad and check_validity:
        raise NotApplicable(f"{_THEOREM[method]} not applicable: " + "; ".join(bad))
    if bad:
        return Label(method, _OUTSIDE + ": " + "; ".join(bad), Soundness.NOT_A_GUARANTEE)
    return Label(method, _NOTE[method])
