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
from typing import Any

from shufflekit.accountant import bits, composition, tight
from shufflekit.accountant.core import Mechanism, Soundness, check_delta
from shufflekit.accountant.ledger import Ledger
from shufflekit.accountant.policy import TightCost, cost_model
from shufflekit.app.state import default_ledger_url
from shufflekit.base.errors import AccountantError, InvalidParameters, LedgerNotFound

RoundMech = Mechanism | bits.BitsMechanism


def parse_round(spec: str) -> tuple[RoundMech, int]:
    """(mechanism, count) of "N,K,EPS0[,COUNT]" (K: categories, or bits:L)."""
    parts = [p.strip() for p in str(spec).split(",")]
    if len(parts) not in (3, 4):
        raise InvalidParameters(f"--round takes N,K,EPS0[,COUNT] (K may be bits:L), got {spec!r}")
    try:
        n = int(parts[0])
        eps0 = float(parts[2])
        count = int(parts[3]) if len(parts) == 4 else 1
    except ValueError:
        raise InvalidParameters(
            f"--round takes N,K,EPS0[,COUNT] with integers N, COUNT and a number EPS0, got {spec!r}"
        ) from None
    if count < 1:
        raise InvalidParameters(f"--round COUNT must be >= 1, got {count} in {spec!r}")
    return bits.round_mechanism(parts[1], n, eps0), count


def ledger_rounds(url: str | None, deployment: str) -> tuple[list[RoundMech], str, float, float]:
    """(committed rounds as the ledger accounts them, cost model, budget delta, ledger's own
    spent epsilon) of a deployment; LedgerNotFound / LedgerError when there is none."""
    try:
        led = Ledger(url or default_ledger_url(), create=False)
    except LedgerNotFound as exc:
        raise LedgerNotFound(exc.where, deployment) from None
    st = led.status(deployment)
    rounds = [r.mechanism for r in st.rounds if r.status == "committed"]
    return rounds, st.cost_model, st.budget.delta_total, st.epsilon_spent


def _grouped(rounds: list[tuple[RoundMech, int]]) -> tuple[list[RoundMech], list[int]]:
    counts: Counter[RoundMech] = Counter()
    for m, c in rounds:
        counts[m] += c
    return list(counts), list(counts.values())


def _krr_lower(mechs: list[Mechanism], counts: list[int], delta: float) -> float:
    """The composed attack's epsilon (one round: tight's own attack)."""
    if len(mechs) == 1 and counts == [1]:
        low = tight.tight_epsilon(mechs[0], delta).lower_epsilon
        return float(low) if low is not None else 0.0
    b = composition.compose_rounds_bounds(mechs, counts=counts)
    return float(b.lower.epsilon(delta)) if b.lower is not None else 0.0


def rounds_row(
    rounds: list[tuple[RoundMech, int]], delta: float, model: str = "tight"
) -> dict[str, Any]:
    """The epsilon row (keys of `cli_privacy.ROW_KEYS`, plus `round_list`) of the rounds."""
    t0 = time.perf_counter()
    delta = check_delta(delta)
    if not rounds:
        raise InvalidParameters("no rounds to compose (the ledger has no committed round)")
    mechs, counts = _grouped(rounds)
    total = sum(counts)
    krr = [m for m in mechs if isinstance(m, Mechanism)]
    expanded = [m for m, c in zip(mechs, counts, strict=True) for _ in range(c)]
    lower: float | None = None
    if len(krr) == len(mechs):  # the ledger's own path
        krr_counts = counts
        eps = cost_model(model).total_epsilon(krr_as_list(expanded), delta)
        if model == TightCost.name:
            try:
                lower = _krr_lower(krr, krr_counts, delta)
            except AccountantError:  # the lower bound is extra information: never fail on it
                lower = None
        note = f"{total} rounds composed by the ledger's cost model '{model}'"
        if model == TightCost.name:
            note += " (dominating pairs, PLD); lower bound: the composed attack"
    else:
        eps = bits.rounds_epsilon(expanded, delta) if total == 1 else _mixed(mechs, counts, delta)
        note = (
            f"{total} rounds: k-RR dominating pairs and the bit rounds' generic pair "
            "composed (PLD), capped by the sum of eps0; no attack for bit rounds"
        )
    return {
        "method": model if len(krr) == len(mechs) else "tight+bits",
        "soundness": Soundness.SOUND_UPPER.value,
        "summary": "heterogeneous rounds composed",
        "status": "ok",
        "epsilon": eps,
        "lower_bound": lower,
        "delta": delta,
        "log_delta": math.log(delta),
        "rounds": total,
        "round_list": [
            {"n": m.n, "mechanism": bits.mechanism_tag(m), "eps0": m.eps0, "count": c}
            for m, c in zip(mechs, counts, strict=True)
        ],
        "note": note,
        "seconds": time.perf_counter() - t0,
    }


def krr_as_list(expanded: list[RoundMech]) -> list[Mechanism]:
    """The k-RR rounds of a list that holds only k-RR rounds (typed for the cost model)."""
    out = [m for m in expanded if isinstance(m, Mechanism)]
    if len(out) != len(expanded):
        raise InvalidParameters("the ledger's cost models take k-RR rounds only")
    return out


def _mixed(mechs: list[RoundMech], counts: list[int], delta: float) -> float:
    """k-RR and bit rounds: their dominating pairs composed, capped by the LDP sum."""
    plds = [
        composition.round_pld(m) if isinstance(m, Mechanism) else bits.bits_pld(m) for m in mechs
    ]
    composed = composition.compose(plds, counts=counts).epsilon(delta)
    ldp_sum = float(sum(m.eps0 * c for m, c in zip(mechs, counts, strict=True)))
    return min(float(composed), ldp_sum)
