"""`ldp`: the local guarantee alone, no amplification: the cap of every other method (the
minimum of two sound bounds is sound), and the labelled, capped results every bound returns.

Shuffled k-RR releases a post-processing of all n reports, and the target's report is
independent of the other users' reports. So the round is at least as private as one k-RR(eps0)
report: (eps0, 0)-DP, and more precisely the whole privacy profile of k-RR,

    delta(eps) = max(0, (e^eps0 - e^eps) / (e^eps0 + k - 1)),

the hockey-stick divergence between k-RR(x0) and k-RR(x1) (only the output y = x0 contributes).
At eps >= eps0 it is 0, which is the (eps0, 0) guarantee; below eps0 it is the exact best
statement a non-amplified analysis can make. `Soundness.SOUND_UPPER`, for any n.

`cap_delta` / `cap_epsilon` apply this bound to another method's result (pointwise minimum of
two valid bounds is valid) and say so in `note` and `details["ldp_cap_applied"]`.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from shufflekit.accountant.core import (
    Mechanism,
    PrivacyLossDistribution,
    PrivacyResult,
    Soundness,
    check_query,
)
from shufflekit.accountant.numerics.krr import krr
from shufflekit.accountant.numerics.logspace import NEG_INF, log1mexp
from shufflekit.accountant.numerics.roots import solve_epsilon

METHOD = "ldp"
SUMMARY = "LDP bound of one k-RR(eps0) report, no amplification ((eps0, 0) and its profile)"
CAP_NOTE = "capped by the LDP bound (k-RR profile, (eps0, 0))"


def ldp_log_delta_value(mech: Mechanism, epsilon: float) -> float:
    """log of the k-RR hockey-stick divergence at e^epsilon (-inf when epsilon >= eps0)."""
    if epsilon >= mech.eps0:
        return NEG_INF
    return mech.eps0 + log1mexp(epsilon - mech.eps0) - krr(mech.k, mech.eps0).log_norm


def ldp_epsilon_value(mech: Mechanism, delta: float) -> float:
    """Smallest epsilon >= 0 with k-RR delta(epsilon) <= delta."""
    if delta <= 0.0:
        return float(mech.eps0)
    # e^eps = e^eps0 - delta (e^eps0 + k - 1)
    frac = delta / krr(mech.k, mech.eps0).p
    if frac >= 1.0:
        return 0.0
    e = max(0.0, mech.eps0 + math.log1p(-frac))
    # outward rounding: near eps0, delta(e) is a difference of close numbers
    log_d = math.log(delta)
    while e < mech.eps0 and ldp_log_delta_value(mech, e) > log_d:
        e = min(mech.eps0, e + max(4 * math.ulp(mech.eps0), 1e-15 * mech.eps0))
    return e


def ldp_delta(mech: Mechanism, epsilon: float) -> PrivacyResult:
    """delta(epsilon) of one k-RR report: the LDP bound (eps0, 0) with its full profile."""
    t0 = time.perf_counter()
    check_query(mech, epsilon)
    return PrivacyResult(
        method=METHOD,
        epsilon=float(epsilon),
        log_delta=ldp_log_delta_value(mech, epsilon),
        soundness=Soundness.SOUND_UPPER,
        note="no amplification: privacy profile of one k-RR report (0 at eps >= eps0)",
        seconds=time.perf_counter() - t0,
        details={"ldp_cap_applied": False},
    )


def ldp_epsilon(mech: Mechanism, delta: float) -> PrivacyResult:
    """epsilon(delta) of one k-RR report (about eps0 for any small delta)."""
    t0 = time.perf_counter()
    check_query(mech, delta=delta)
    return PrivacyResult(
        method=METHOD,
        epsilon=ldp_epsilon_value(mech, delta),
        log_delta=math.log(delta) if delta > 0 else NEG_INF,
        soundness=Soundness.SOUND_UPPER,
        note="no amplification: privacy profile of one k-RR report",
        seconds=time.perf_counter() - t0,
        details={"ldp_cap_applied": False},
    )


def ldp_pld(mech: Mechanism) -> PrivacyLossDistribution:
    """PLD of k-RR(x0) vs k-RR(x1): +eps0 w.p. p, -eps0 w.p. 1/(e^eps0+k-1), 0 otherwise."""
    check_query(mech)
    log_norm = krr(mech.k, mech.eps0).log_norm
    losses = [mech.eps0, -mech.eps0]
    log_probs = [mech.eps0 - log_norm, -log_norm]
    if mech.k > 2:
        losses.append(0.0)
        log_probs.append(math.log(mech.k - 2) - log_norm)
    return PrivacyLossDistribution(
        losses=np.asarray(losses, dtype=np.float64),
        log_probs=np.asarray(log_probs, dtype=np.float64),
        log_inf_mass=NEG_INF,
        description=f"k-RR(eps0={mech.eps0:g}, k={mech.k}) without shuffling (exact pair)",
    )


def cap_delta(result: PrivacyResult, mech: Mechanism) -> PrivacyResult:
    """min(result, LDP bound) at result.epsilon, recorded in note and details."""
    return _capped(result, "log_delta", ldp_log_delta_value(mech, result.epsilon))


def cap_epsilon(result: PrivacyResult, mech: Mechanism, delta: float) -> PrivacyResult:
    """min(result, LDP bound) at the target delta, recorded in note and details."""
    return _capped(result, "epsilon", ldp_epsilon_value(mech, delta))


def _capped(result: PrivacyResult, field: str, cap: float) -> PrivacyResult:
    """`result` with `field` ("log_delta" or "epsilon") lowered to `cap` if that is smaller."""
    details = dict(result.details)
    value = getattr(result, field)
    if cap < value:
        details["ldp_cap_applied"] = True
        details[f"uncapped_{field}"] = value
        note = CAP_NOTE if not result.note else f"{result.note}; {CAP_NOTE}"
        lowered: dict[str, Any] = {field: cap}
        return dataclasses.replace(result, note=note, details=details, **lowered)
    details.setdefault("ldp_cap_applied", False)
    return dataclasses.replace(result, details=details)


def epsilon_with_cap(
    mech: Mechanism,
    delta: float,
    log_delta_curve: Callable[[float], float],
    *,
    side: str,
) -> tuple[float, bool]:
    """epsilon for a target delta from a method's log-delta curve, capped by the LDP bound.

    Returns (epsilon, cap_applied). `side="upper"` for sound upper bounds (the returned point
    satisfies the curve's delta <= target), `side="lower"` for lower bounds (curve >= target).
    Only [0, LDP epsilon] is searched: beyond it the cap wins anyway.
    """
    e_cap = ldp_epsilon_value(mech, delta)
    if delta <= 0.0:
        return e_cap, True
    eps, crossed = solve_epsilon(log_delta_curve, math.log(delta), 0.0, e_cap, side=side)
    return eps, not crossed


@dataclass(frozen=True)
class Label:
    """How a method labels its results: its name, what they may be used for, and a note."""

    method: str
    note: str
    soundness: Soundness = Soundness.SOUND_UPPER

    def result(
        self,
        epsilon: float,
        log_delta: float,
        t0: float,
        details: dict[str, Any],
        note: str = "",
        lower: tuple[float, float] | None = None,
    ) -> PrivacyResult:
        """The (epsilon, log delta) point as this method's result, timed from `t0`, with the
        matching lower bound (epsilon, log delta) if the method has one; `note` is added to
        the method's own."""
        return PrivacyResult(
            method=self.method,
            epsilon=epsilon,
            log_delta=log_delta,
            soundness=self.soundness,
            lower_epsilon=lower[0] if lower is not None else None,
            lower_log_delta=lower[1] if lower is not None else None,
            note="; ".join(part for part in (self.note, note) if part),
            seconds=time.perf_counter() - t0,
            details=details,
        )


def delta_result(
    mech: Mechanism,
    epsilon: float,
    log_delta: float,
    label: Label,
    t0: float,
    details: dict[str, Any],
) -> PrivacyResult:
    """A method's delta at `epsilon` (timed from `t0`) as a result capped by the LDP bound."""
    return cap_delta(label.result(float(epsilon), log_delta, t0, details), mech)


def epsilon_result(
    mech: Mechanism,
    delta: float,
    epsilon: float,
    label: Label,
    t0: float,
    details: dict[str, Any],
) -> PrivacyResult:
    """A method's epsilon at `delta` > 0 (a closed form) as a result capped by the LDP bound."""
    return cap_epsilon(label.result(epsilon, math.log(delta), t0, details), mech, delta)


def solved_epsilon_result(
    mech: Mechanism,
    delta: float,
    log_delta_curve: Callable[[float], float],
    label: Label,
    t0: float,
    details: dict[str, Any],
    *,
    side: str = "upper",
    cap_note: str = CAP_NOTE,
) -> PrivacyResult:
    """A method's epsilon at `delta`, solved on its log-delta curve by `epsilon_with_cap` (so
    never above the LDP bound), as a result; `cap_note` is added to the note when the cap won."""
    eps, capped = epsilon_with_cap(mech, delta, log_delta_curve, side=side)
    log_delta = math.log(delta) if delta > 0 else NEG_INF
    details = {**details, "ldp_cap_applied": capped}
    return label.result(eps, log_delta, t0, details, cap_note if capped else "")
