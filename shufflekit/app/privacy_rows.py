"""The rows `shufflekit privacy` prints: epsilon or delta of identical rounds by one method.

Plain data (JSON-able dicts with a fixed set of keys), computed here and rendered by
`cli_privacy`; the benchmarks read the same rows, so what they measure is what users see.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from shufflekit.accountant.numerics.logspace import exp_of, log_of
from shufflekit.base.errors import AccountantError, AccuracyError, InvalidParameters, NotApplicable

if TYPE_CHECKING:
    from shufflekit.accountant.core import Mechanism, PrivacyResult
    from shufflekit.accountant.registry import Method


ROW_KEYS = (
    "method",
    "soundness",
    "summary",
    "status",
    "epsilon",
    "lower_bound",
    "delta",
    "log_delta",
    "rounds",
    "note",
    "seconds",
)
"""Keys of every epsilon row (`privacy epsilon`, each row of `privacy compare`): a fixed set, with
null where a value does not apply, so that scripts can index rows without checking."""


def _blank_row(m: Method, delta: float, rounds: int) -> dict[str, Any]:
    """An epsilon row of method `m` with every key of ROW_KEYS present and nothing computed."""
    return {
        "method": m.name,
        "soundness": m.soundness.value,
        "summary": m.summary,
        "status": "ok",
        "epsilon": None,
        "lower_bound": None,
        "delta": delta,
        "log_delta": log_of(delta),
        "rounds": rounds,
        "note": "",
        "seconds": 0.0,
    }


def tight_lower_epsilon(mech: Mechanism, delta: float, rounds: int) -> float:
    """epsilon of `rounds` rounds of an explicit worst-case dataset (the attack) at `delta`:
    a lower bound on the true epsilon, so the gap of an upper bound can be stated (several
    rounds: the composed attack of `compose_rounds_bounds`, exact curves on the grid)."""
    from shufflekit.accountant import composition, tight

    if rounds == 1:
        low = tight.tight_epsilon(mech, delta).lower_epsilon
        return float(low) if low is not None else 0.0
    attack = composition.compose_rounds_bounds([mech], counts=[rounds]).lower
    return float(attack.epsilon(delta)) if attack is not None else 0.0


def epsilon_row(m: Method, mech: Mechanism, delta: float, rounds: int) -> dict[str, Any]:
    """epsilon of `rounds` identical rounds at `delta` by method `m`, as a JSON-able row.

    The row has exactly the keys of ROW_KEYS; raises AccountantError (NotApplicable, ...) when
    the method cannot answer.
    """
    from shufflekit.accountant import composition, tight
    from shufflekit.accountant.core import Soundness
    from shufflekit.accountant.policy import composed_epsilon

    t0 = time.perf_counter()
    row = _blank_row(m, delta, rounds)
    if m.name == "tight" and rounds == 1:
        # One evaluation gives both numbers. The registry's `tight` (m.epsilon) caps the answer
        # by the k-RR profile's epsilon at delta (a hair below eps0); the ledger's TightCost
        # caps the same tight_epsilon by eps0 itself. Both caps are sound, and they differ only
        # when tight finds no amplification, where TightCost's is the larger. We report the
        # ledger's value (min(tight, eps0), TightCost's formula) so that `privacy epsilon` and
        # the budget checks agree exactly on the same round.
        res = tight.tight_epsilon(mech, delta)
        ldp_only = res.epsilon >= mech.eps0
        row |= {
            "epsilon": min(float(res.epsilon), mech.eps0),
            "lower_bound": res.lower_epsilon,
            "note": res.note + ("; no amplification at this delta: (eps0, 0)" if ldp_only else ""),
        }
    elif rounds == 1:
        res = m.epsilon(mech, delta)
        row |= {"epsilon": res.epsilon, "lower_bound": res.lower_epsilon, "note": res.note}
    elif m.name == "tight":
        # the ledger's number (`TightCost`), and which composition answered
        epsilon, answered = composed_epsilon([mech] * rounds, delta)
        bounds = composition.compose_rounds_bounds([mech], counts=[rounds])
        if bounds.upper.certifies(math.log(delta)):
            lower, best = bounds.epsilon(delta)
            how = "dominating pairs composed (PLD, pessimistic grid)" + (
                ", tightened by the adaptive k = 2 dynamic program (k2_dp)"
                if best < bounds.upper.epsilon(delta)  # the k = 2 DP beat the composed pair
                else ""
            )
        else:
            lower = bounds.lower_epsilon(delta)
            how = (
                f"dominating pairs: {answered}"
                + f" (one FFT power certifies delta >= {bounds.upper.min_certified_delta:.2g} only)"
            )
        row |= {
            "epsilon": epsilon,
            "lower_bound": lower,
            "note": how
            + ", capped by the LDP sum; lower bound: the worst-case dataset's attack"
            + (" composed" if lower is not None else " cannot be certified at this delta"),
        }
    elif m.name == "ldp":
        row |= {"epsilon": rounds * mech.eps0, "note": "pure DP composes by summation"}
    elif m.pld is not None:
        sound = m.soundness is Soundness.SOUND_UPPER
        pld = m.pld(mech)
        how = "the method's pair composed (PLD)"
        try:
            composed = composition.compose([pld], counts=[rounds]).epsilon(delta)
        except AccuracyError as exc:
            if not sound:  # a Rényi bound of a pair that is not an upper bound means nothing
                raise
            composed, by = composition.fallback_epsilon([pld], [rounds], delta, exc)
            how = f"the method's pair: {by} (one FFT power cannot certify this delta)"
        row |= {"epsilon": min(composed, rounds * mech.eps0 if sound else math.inf), "note": how}
    else:
        raise NotApplicable(
            f"{m.name} is a per-round formula with no privacy loss "
            "distribution: it cannot be composed over rounds"
        )
    row["seconds"] = time.perf_counter() - t0
    return row


def delta_row(
    m: Method, mech: Mechanism, epsilon: float, rounds: int, nx0: int | None
) -> dict[str, Any]:
    """delta of `rounds` identical rounds at `epsilon` by method `m`."""
    from shufflekit.accountant import biswas, composition, tight

    t0 = time.perf_counter()
    row: dict[str, Any] = {
        "method": m.name,
        "soundness": m.soundness.value,
        "epsilon": epsilon,
        "rounds": rounds,
        "lower_bound": None,
        "lower_bound_log_delta": None,
        "note": "",
    }
    if nx0 is not None and not m.name.startswith("biswas"):
        raise InvalidParameters("--nx0 applies to the biswas methods only")
    if rounds == 1:
        res: PrivacyResult
        if m.name == "biswas" and nx0 is not None:
            res = biswas.biswas_delta(mech, epsilon, n_x0=nx0)
        elif m.name == "biswas-corrected" and nx0 is not None:
            res = biswas.corrected_delta(mech, epsilon, n_x0=nx0)
        else:
            res = m.delta(mech, epsilon)
        row |= {"log_delta": res.log_delta, "note": res.note}
        if res.lower_log_delta is not None:
            row["lower_bound_log_delta"] = res.lower_log_delta
            row["lower_bound"] = exp_of(res.lower_log_delta)
    elif m.name == "ldp":
        row |= {
            "log_delta": 0.0 if epsilon < rounds * mech.eps0 else -math.inf,
            "note": "pure DP: delta is 0 from R * eps0 on (and not bounded below it)",
        }
    elif m.pld is not None:
        row["log_delta"] = composition.compose([m.pld(mech)], counts=[rounds]).log_delta(epsilon)
        if m.name == "tight":
            low = composition.compose_lower([tight.attack_pld(mech)], counts=[rounds])
            row["lower_bound_log_delta"] = low.log_delta(epsilon)
            row["lower_bound"] = exp_of(row["lower_bound_log_delta"])
    else:
        raise NotApplicable(f"{m.name} cannot be composed over rounds (no PLD)")
    row["delta"] = exp_of(row["log_delta"])
    row["seconds"] = time.perf_counter() - t0
    return row


def compare_rows(
    mech: Mechanism,
    delta: float,
    rounds: int,
    variants: bool = False,
    progress: Callable[[int, str], None] | None = None,
) -> list[dict[str, Any]]:
    """One row per method, all with the keys of ROW_KEYS; a method that cannot answer gets
    status "not applicable" or "error", epsilon null, and the reason in `note`.
    `progress(done, method)` is called after each method."""
    from shufflekit.accountant.registry import all_methods

    rows: list[dict[str, Any]] = []
    for m in all_methods(include_variants=variants):
        rows.append(_compare_row(m, mech, delta, rounds))
        if progress is not None:
            progress(len(rows), m.name)
    return rows


def _compare_row(m: Method, mech: Mechanism, delta: float, rounds: int) -> dict[str, Any]:
    """One method's row of `compare_rows`."""
    t0 = time.perf_counter()
    try:
        return epsilon_row(m, mech, delta, rounds)
    except NotApplicable as exc:
        status, note = "not applicable", f"not applicable: {exc}"
    except AccountantError as exc:
        status, note = "error", f"error: {exc}"
    row = _blank_row(m, delta, rounds)
    row |= {"status": status, "note": note, "seconds": time.perf_counter() - t0}
    return row
