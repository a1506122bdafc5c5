"""`privacy epsilon --round N,K,EPS0[,COUNT]` and `--from-ledger URL --deployment D`:
heterogeneous rounds composed exactly as the ledger composes its rounds.

k-RR rounds go through the budget's cost model (`policy.TightCost` by default: one round
exactly, several through the composed dominating pairs, capped by the sum of eps0), the very
function `Ledger.status` calls, so the CLI and the ledger agree on the same rounds. Bit-vector
rounds (`bits:L` in place of K) compose their generic dominating pair (`accountant.bits`) with
the k-RR rounds' pairs. The lower bound is the composed attack (one explicit dataset pair per
round, order x0|x1 throughout), so the printed gap is what is known.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import typer

from shufflekit.accountant import bits, composition, tight
from shufflekit.accountant.core import Mechanism, Soundness, check_delta
from shufflekit.accountant.curves import CurveCache
from shufflekit.accountant.policy import charges_epsilon
from shufflekit.accountant.round_types import RoundType
from shufflekit.app.cli_common import count as count_of_people
from shufflekit.app.state import open_ledger
from shufflekit.base.errors import AccountantError, InvalidParameters

RoundMech = Mechanism | bits.BitsMechanism
Charge = tuple[RoundType, int]


def parse_round(spec: str) -> tuple[Charge, int]:
    """((round type, n), count) of "N,K,EPS0[,COUNT]" (K: categories, or bits:L)."""
    parts = [p.strip() for p in str(spec).split(",")]
    if len(parts) not in (3, 4):
        raise InvalidParameters(f"--round takes N,K,EPS0[,COUNT] (K may be bits:L), got {spec!r}")
    try:  # counts as `--n` takes them: 10000, 10_000 or 1e4
        n = count_of_people(parts[0])
        eps0 = float(parts[2])
        count = count_of_people(parts[3]) if len(parts) == 4 else 1
    except (ValueError, typer.BadParameter):
        raise InvalidParameters(
            f"--round takes N,K,EPS0[,COUNT] with whole numbers N, COUNT (1e4 is fine) and a "
            f"number EPS0, got {spec!r}"
        ) from None
    if count < 1:
        raise InvalidParameters(f"--round COUNT must be >= 1, got {count} in {spec!r}")
    mech = bits.round_mechanism(parts[1], n, eps0)  # validates n, K or bits:L, eps0
    kind, size = bits.parse_mechanism_tag(parts[1])
    return (RoundType(kind, size, float(mech.eps0)), n), count


@dataclass(frozen=True)
class LedgerRounds:
    """A deployment's committed rounds as its ledger charges them, and what it says of them."""

    charges: list[Charge]
    cost_model: str
    mode: str
    delta: float  # the budget's
    epsilon_spent: float  # the ledger's own figure, at the budget's delta
    curves: CurveCache  # the ledger's stored curves: composing them again is fast


LOWER_MAX_KINDS = 20  # distinct rounds the composed attack is computed for


def ledger_rounds(url: str | None, deployment: str) -> LedgerRounds:
    """The committed rounds of a deployment (`LedgerRounds`); LedgerNotFound / LedgerError if
    none."""
    led = open_ledger(url, deployment)
    st = led.status(deployment)
    charges = [r.charge for r in st.rounds if r.status == "committed"]
    b = st.budget
    return LedgerRounds(charges, st.cost_model, b.mode, b.delta_total, st.epsilon_spent, led.curves)


def _mech(c: Charge) -> RoundMech:
    t, n = c
    tag = str(t.size) if t.mechanism == "krr" else f"{t.mechanism}:{t.size}"
    return bits.round_mechanism(tag, n, t.eps0)


def _krr_lower(mechs: list[Mechanism], counts: list[int], delta: float) -> float:
    """The composed attack's epsilon (one round: tight's own attack)."""
    if len(mechs) == 1 and counts == [1]:
        low = tight.tight_epsilon(mechs[0], delta).lower_epsilon
        return float(low) if low is not None else 0.0
    b = composition.compose_rounds_bounds(mechs, counts=counts)
    return float(b.lower.epsilon(delta)) if b.lower is not None else 0.0


def rounds_row(
    rounds: list[tuple[Charge, int]],
    delta: float,
    model: str = "tight",
    mode: str = "planned",
    cache: CurveCache | None = None,
) -> dict[str, Any]:
    """The epsilon row (keys of `privacy_rows.ROW_KEYS`, plus `round_list`) of the rounds,
    charged by `policy.charges_epsilon` exactly as the ledger charges them (from the ledger's
    stored curves, `cache`, when they come from one). The composed attack (a lower bound) is
    left out beyond `LOWER_MAX_KINDS` distinct rounds: it composes every one afresh."""
    t0 = time.perf_counter()
    delta = check_delta(delta)
    if not rounds:
        raise InvalidParameters("no rounds to compose (the ledger has no committed round)")
    grouped: Counter[Charge] = Counter()
    for c, k in rounds:
        grouped[c] += k
    charges = [c for c, k in grouped.items() for _ in range(k)]
    eps = charges_epsilon(model, charges, delta, mode=mode, cache=cache)
    mechs = [_mech(c) for c in grouped]
    counts = list(grouped.values())
    krr = [m for m in mechs if isinstance(m, Mechanism)]
    lower: float | None = None
    if model == "tight" and len(krr) == len(mechs) <= LOWER_MAX_KINDS:
        try:
            lower = _krr_lower(krr, counts, delta)
        except AccountantError:  # the lower bound is extra information: never fail on it
            lower = None
    how = "a Rényi filter (adaptive mode)" if mode == "adaptive" else "dominating pairs (PLD)"
    note = f"{len(charges)} round(s) charged as the ledger does: cost model '{model}'"
    if model == "tight":
        note += f", {how}, capped by the sum of eps0"
    note += "; lower bound: the composed attack" if lower is not None else ""
    if len(mechs) > LOWER_MAX_KINDS:
        note += f"; lower bound: not computed for more than {LOWER_MAX_KINDS} distinct rounds"
    return {
        "method": model,
        "soundness": Soundness.SOUND_UPPER.value,
        "summary": "heterogeneous rounds composed",
        "status": "ok",
        "epsilon": eps,
        "lower_bound": lower,
        "delta": delta,
        "log_delta": math.log(delta),
        "rounds": len(charges),
        "mode": mode,
        "round_list": [
            {"n": m.n, "mechanism": bits.mechanism_tag(m), "eps0": m.eps0, "count": c}
            for m, c in zip(mechs, counts, strict=True)
        ],
        "note": note,
        "seconds": time.perf_counter() - t0,
    }
