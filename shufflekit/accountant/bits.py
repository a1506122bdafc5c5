"""Accounting for bit-vector rounds (seed 003): each user flips every bit of an L-bit record
with probability q, eps0 = L ln(p/q) per record (p = 1 - q), then the reports are shuffled.

What is sound here, and why (research/seed-003-k-randomization.md):

- **Pure epsilon does not improve by shuffling** (note's D1): the histogram of n shuffled
  records is exactly eps0-DP, not better; the worst outputs are the extreme histograms. So
  `bits_epsilon(mech, 0)` is eps0 and every result says so.
- **(epsilon, delta) through a GENERIC eps0-LDP amplification bound**: the Feldman-McMillan-Talwar
  clones pair (`accountant.clones`), valid for any eps0-LDP randomizer, hence for this one. It
  is not specific to bit randomization (it is looser than a bits-specific analysis would be),
  and the results are labelled so.
- **Capped by the exact local profile** of one L-bit record (records x and its complement, the
  worst pair): delta(eps) = sum_j C(L,j) p^(L-j) q^j (1 - e^(eps - (L-2j) a))^+, a = ln(p/q).
  The minimum of two sound curves is sound.

The round-level API the ledger and the CLI call, for k-RR and bit rounds alike: `RoundMechanism`,
`parse_mechanism_tag` ("10" or "bits:3"), `round_mechanism`, `mechanism_tag`, `round_pld`,
`round_epsilon`, `rounds_epsilon` (composition of a heterogeneous list, like `TightCost`).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.special import gammaln

from shufflekit.accountant import composition, ldp, tight
from shufflekit.accountant.clones import METHOD as CLONES_METHOD
from shufflekit.accountant.clones import clones_log_delta, clones_pld
from shufflekit.accountant.composition import compose
from shufflekit.accountant.core import (
    EPS0_MAX,
    EPS0_MIN,
    Mechanism,
    PrivacyLossDistribution,
    PrivacyResult,
    Soundness,
    check_delta,
    check_epsilon,
)
from shufflekit.accountant.numerics.logspace import NEG_INF, log1mexp, logsumexp
from shufflekit.accountant.numerics.roots import solve_epsilon
from shufflekit.accountant.round_types import MAX_BITS
from shufflekit.base.checks import real, whole
from shufflekit.base.errors import InvalidParameters

METHOD = "bits-generic"
SUMMARY = (
    "bit-vector records: GENERIC eps0-LDP amplification (Feldman-McMillan-Talwar clones), "
    "capped by the exact L-bit local profile"
)
PURE_EPSILON_NOTE = (
    "pure epsilon (delta = 0) does not improve by shuffling: it stays eps0 = L ln(p/q) "
    "(the extreme histograms are as revealing as one record)"
)
GENERIC_NOTE = (
    "generic eps0-LDP amplification bound (Feldman-McMillan-Talwar clones, valid for any "
    "eps0-LDP randomizer), not specific to bit randomization"
)


def check_bits(bits: object) -> int:
    """L as an int in [1, MAX_BITS]; InvalidParameters otherwise (bool and floats refused)."""
    return whole("L (bits per record)", bits, 1, MAX_BITS, InvalidParameters)


def flip_probability(eps0: float, bits: int) -> float:
    """q = 1 / (1 + e^(eps0/L)): the per-bit flip probability giving eps0 per L-bit record."""
    return 1.0 / (1.0 + math.exp(eps0 / bits))


def eps0_for_flip(q: float, bits: int) -> float:
    """eps0 = L ln((1-q)/q) of a record whose L bits each flip with probability q in (0, 1/2)."""
    if not (isinstance(q, float | int) and 0.0 < q < 0.5):
        raise InvalidParameters(f"flip probability q must be in (0, 1/2), got {q!r}")
    return bits * (math.log1p(-q) - math.log(q))


@dataclass(frozen=True)
class BitsMechanism:
    """One round: n users, each flipping every bit of an L-bit record with probability
    q = 1/(1 + e^(eps0/L)) (eps0 per record), then a uniform shuffle."""

    n: int
    bits: int
    eps0: float

    def __post_init__(self) -> None:
        whole("n (number of users)", self.n, 1, error=InvalidParameters)
        check_bits(self.bits)
        # the range of every round type (`round_types.check_entry`): the generic bound runs
        # binary RR at eps0 (`generic`), whose e^eps0 overflows above ~709.78
        real("eps0", self.eps0, EPS0_MIN, EPS0_MAX, error=InvalidParameters)

    @property
    def q(self) -> float:
        """Per-bit flip probability."""
        return flip_probability(self.eps0, self.bits)

    @property
    def tag(self) -> str:
        """The mechanism tag of round types and the CLI: "bits:L"."""
        return f"bits:{self.bits}"

    @property
    def generic(self) -> Mechanism:
        """An eps0-LDP stand-in for the generic bounds (they ignore k; k = 2 is binary RR,
        whose local profile dominates every eps0-LDP randomizer's)."""
        return Mechanism(n=int(self.n), k=2, eps0=float(self.eps0))


RoundMechanism = Mechanism | BitsMechanism


# ----------------------------------------------------------------------------- local profile


def bits_ldp_log_delta(bits: int, eps0: float, epsilon: float) -> float:
    """log delta(epsilon) of ONE L-bit record, worst pair (x vs its complement), exact.

    The privacy loss is (L - 2j) a with probability C(L,j) p^(L-j) q^j, a = eps0/L: j bits flipped.
    """
    a = eps0 / bits
    q = flip_probability(eps0, bits)
    j = np.arange(bits + 1, dtype=np.float64)
    loss = (bits - 2.0 * j) * a
    logc = gammaln(bits + 1.0) - gammaln(j + 1.0) - gammaln(bits - j + 1.0)
    lp = logc + (bits - j) * math.log1p(-q) + j * math.log(q)
    sel = loss > epsilon
    if not np.any(sel):
        return NEG_INF
    return logsumexp(lp[sel] + log1mexp(epsilon - loss[sel]))


def bits_ldp_pld(mech: BitsMechanism) -> PrivacyLossDistribution:
    """PLD of one L-bit record, x vs its complement (no shuffle): the exact local pair."""
    a = mech.eps0 / mech.bits
    q = mech.q
    j = np.arange(mech.bits + 1, dtype=np.float64)
    logc = gammaln(mech.bits + 1.0) - gammaln(j + 1.0) - gammaln(mech.bits - j + 1.0)
    return PrivacyLossDistribution(
        losses=(mech.bits - 2.0 * j) * a,
        log_probs=logc + (mech.bits - j) * math.log1p(-q) + j * math.log(q),
        description=f"one {mech.bits}-bit record, eps0={mech.eps0:g}, no shuffle (exact pair)",
    )


def _check(mech: object) -> BitsMechanism:
    if not isinstance(mech, BitsMechanism):
        raise InvalidParameters(f"expected a BitsMechanism, got {type(mech).__name__}")
    return mech


def _curve(mech: BitsMechanism) -> Any:
    """log delta(eps) = min(clones pair (upper), exact local profile)."""

    def f(e: float) -> float:
        local = bits_ldp_log_delta(mech.bits, mech.eps0, e)
        if local == NEG_INF:
            return NEG_INF
        return min(clones_log_delta(mech.n, mech.eps0, e).upper, local)

    return f


def _result(
    mech: BitsMechanism, epsilon: float, log_delta: float, t0: float, **details: Any
) -> PrivacyResult:
    return PrivacyResult(
        method=METHOD,
        epsilon=float(epsilon),
        log_delta=float(log_delta),
        soundness=Soundness.SOUND_UPPER,
        note=f"{GENERIC_NOTE}; capped by the exact L-bit local profile; {PURE_EPSILON_NOTE}",
        seconds=time.perf_counter() - t0,
        details={
            "generic_bound": CLONES_METHOD,
            "bits": mech.bits,
            "flip_probability": mech.q,
            "pure_epsilon": float(mech.eps0),
            "pure_epsilon_improves_by_shuffling": False,
            **details,
        },
    )


def bits_delta(mech: BitsMechanism, epsilon: float) -> PrivacyResult:
    """delta(epsilon) of a shuffled bit-vector round: generic clones bound, locally capped."""
    t0 = time.perf_counter()
    _check(mech)
    e = check_epsilon(epsilon)
    local = bits_ldp_log_delta(mech.bits, mech.eps0, e)
    generic = clones_log_delta(mech.n, mech.eps0, e).upper if local > NEG_INF else NEG_INF
    return _result(
        mech,
        e,
        min(local, generic),
        t0,
        log_delta_generic=generic,
        log_delta_local=local,
        local_cap_applied=local < generic,
    )


def bits_epsilon(mech: BitsMechanism, delta: float) -> PrivacyResult:
    """epsilon(delta) of a shuffled bit-vector round; at delta = 0 exactly eps0 (no gain)."""
    t0 = time.perf_counter()
    _check(mech)
    d = check_delta(delta, allow_zero=True)
    if d == 0.0:
        return _result(mech, mech.eps0, NEG_INF, t0)
    eps, _crossed = solve_epsilon(_curve(mech), math.log(d), 0.0, float(mech.eps0), side="upper")
    return _result(mech, eps, math.log(d), t0)


def bits_pld(mech: BitsMechanism) -> PrivacyLossDistribution:
    """Dominating pair for composition: the clones pair of eps0 (generic, NOT capped)."""
    _check(mech)
    return clones_pld(mech.generic)


# ----------------------------------------------------------------------------- round dispatch


def parse_mechanism_tag(tag: str | int) -> tuple[str, int]:
    """("krr", K) for "K" (an integer >= 2) or ("bits", L) for "bits:L"; InvalidParameters else."""
    text = str(tag).strip()
    if text.lower().startswith("bits:"):
        raw = text[5:]
        try:
            value = int(raw)
        except ValueError:
            raise InvalidParameters(f"bits:L needs an integer L, got {raw!r}") from None
        return "bits", check_bits(value)
    try:
        k = int(text)
    except ValueError:
        raise InvalidParameters(
            f"mechanism must be K (categories, an integer >= 2) or bits:L, got {text!r}"
        ) from None
    if not 2 <= k <= 65535:
        raise InvalidParameters(f"k (number of categories) must be in [2, 65535], got {k}")
    return "krr", k


def round_mechanism(tag: str | int, n: int, eps0: float) -> RoundMechanism:
    """The round's mechanism from its tag ("K" or "bits:L"), population n and eps0."""
    kind, size = parse_mechanism_tag(tag)
    if kind == "bits":
        return BitsMechanism(n=n, bits=size, eps0=eps0)
    return Mechanism(n=n, k=size, eps0=eps0)


def mechanism_tag(mech: RoundMechanism) -> str:
    """The tag: "K" for a k-RR round, "bits:L" for a bit-vector round."""
    if isinstance(mech, BitsMechanism):
        return mech.tag
    if isinstance(mech, Mechanism):
        return str(mech.k)
    raise InvalidParameters(f"expected a round mechanism, got {type(mech).__name__}")


def round_pld(mech: RoundMechanism) -> PrivacyLossDistribution:
    """The round's dominating pair: the ledger's for k-RR (`composition.round_pld`: the k = 2
    pair, else the blanket pair on its exact curve; cached), or the bits round's generic pair."""
    if isinstance(mech, BitsMechanism):
        return bits_pld(mech)
    if isinstance(mech, Mechanism):
        return composition.round_pld(mech)
    raise InvalidParameters(f"expected a round mechanism, got {type(mech).__name__}")


def round_epsilon(mech: RoundMechanism, delta: float) -> PrivacyResult:
    """One round's epsilon(delta): tight (LDP-capped) for k-RR, `bits_epsilon` for bits."""
    if isinstance(mech, BitsMechanism):
        return bits_epsilon(mech, delta)
    if isinstance(mech, Mechanism):
        return ldp.cap_epsilon(tight.tight_epsilon(mech, delta), mech, delta)
    raise InvalidParameters(f"expected a round mechanism, got {type(mech).__name__}")


def round_delta(mech: RoundMechanism, epsilon: float) -> PrivacyResult:
    """One round's delta(epsilon): tight (LDP-capped) for k-RR, `bits_delta` for bits."""
    if isinstance(mech, BitsMechanism):
        return bits_delta(mech, epsilon)
    if isinstance(mech, Mechanism):
        return ldp.cap_delta(tight.tight_delta(mech, epsilon), mech)
    raise InvalidParameters(f"expected a round mechanism, got {type(mech).__name__}")


def rounds_epsilon(rounds: Sequence[RoundMechanism], delta: float) -> float:
    """Composed epsilon(delta) of a heterogeneous list of rounds, as `policy.TightCost` does:
    one round exactly, several through their composed dominating pairs; never above the sum
    of the rounds' eps0 (pure DP composes by summation)."""
    rounds = list(rounds)
    if not rounds:
        return 0.0
    for r in rounds:
        mechanism_tag(r)  # type check
    ldp_sum = float(sum(r.eps0 for r in rounds))
    if len(rounds) == 1:
        return min(float(round_epsilon(rounds[0], delta).epsilon), ldp_sum)
    grouped = Counter(rounds)
    plds = [round_pld(m) for m in grouped]
    composed = compose(plds, counts=list(grouped.values())).epsilon(delta)
    return min(float(composed), ldp_sum)
