"""Shared value types of the accountant (a round's mechanism, results, soundness labels, PLDs)
and the checks of a query: the contract between bounds, engines, ledger and CLI.

Every method (tight, blanket, clones, closed forms, Biswas et al.) takes a `Mechanism` and answers
with a `PrivacyResult`; composition works on `PrivacyLossDistribution`s. These types are the
contract between the method modules, the composition engines, the ledger and the CLI.
"""

from __future__ import annotations

import enum
import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from shufflekit.accountant.numerics.krr import KRR, krr
from shufflekit.accountant.numerics.logspace import log1mexp, logsumexp
from shufflekit.base.checks import whole
from shufflekit.base.errors import InvalidParameters

T = TypeVar("T")

EPS0_MAX = 700.0
"""Largest eps0 a Mechanism accepts: e^eps0 (and e^eps for eps < eps0) must be a finite double
(they overflow at ~709.78); such a k-RR reports its true value with probability 1 - 1e-304."""
EPS0_MIN = 1e-6
"""Smallest eps0 a Mechanism accepts: below ~1e-16, e^eps0 rounds to 1, the blanket gamma to 1
and p - q to 0 (bounds and estimators divided by it); at 1e-6 a round already needs ~1e12 k
users to estimate anything."""


@dataclass(frozen=True)
class Mechanism:
    """One round: n users, each applying k-RR(eps0) over k values, then a uniform shuffle."""

    n: int
    k: int
    eps0: float

    def __post_init__(self) -> None:
        # stored as Python numbers (numpy ones are taken); True is refused
        object.__setattr__(
            self, "n", whole("n (number of users)", self.n, 1, error=InvalidParameters)
        )
        object.__setattr__(
            self, "k", whole("k (number of categories)", self.k, 2, error=InvalidParameters)
        )
        if isinstance(self.eps0, bool) or not (
            isinstance(self.eps0, numbers.Real)
            and math.isfinite(self.eps0)
            and EPS0_MIN <= self.eps0 <= EPS0_MAX
        ):
            raise InvalidParameters(
                f"eps0 must be a finite number in [{EPS0_MIN:g}, {EPS0_MAX:g}] (e^eps0 must fit a "
                f"float, and differ from 1), got {self.eps0!r}"
            )
        object.__setattr__(self, "eps0", float(self.eps0))

    @property
    def krr(self) -> KRR:
        """The probabilities of this round's k-RR (p, q, gamma, ...)."""
        return krr(self.k, self.eps0)

    @property
    def p_keep(self) -> float:
        """Probability that k-RR reports the true value."""
        return self.krr.p

    @property
    def gamma(self) -> float:
        """Blanket probability: k-RR = (1-gamma) * truth + gamma * uniform over all k values."""
        return self.krr.gamma


class Soundness(enum.Enum):
    """What a number may be used for. Only SOUND_UPPER may enforce a budget."""

    SOUND_UPPER = "sound upper bound"
    LOWER_BOUND = "lower bound (an attack or a post-processing of one dataset's view)"
    NOT_A_GUARANTEE = "not a differential privacy guarantee (formula as printed)"


@dataclass(frozen=True)
class PrivacyResult:
    """An (epsilon, delta) point of one method, with how it was obtained.

    `log_delta` is always given because delta may underflow a float. For `tight`,
    `lower_epsilon` / `lower_log_delta` is the matching lower bound from an explicit worst-case
    dataset, so the gap is stated with every answer.
    """

    method: str
    epsilon: float
    log_delta: float
    soundness: Soundness
    lower_epsilon: float | None = None
    lower_log_delta: float | None = None
    note: str = ""
    seconds: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def delta(self) -> float:
        """delta as a float (0.0 when it underflows; see log_delta)."""
        return math.exp(self.log_delta) if self.log_delta > -745 else 0.0


@dataclass(frozen=True)
class PrivacyLossDistribution:
    """Discrete privacy loss distribution of a pair (P, Q): the law of log(P(o)/Q(o)), o ~ P.

    `losses` are the finite loss atoms, `log_probs` their log masses under P; `log_inf_mass` is
    the log of P(loss = +inf) (outputs impossible under Q), plus any truncated mass that an upper
    bound must count as infinite loss. delta(eps) = P(inf) + sum_i p_i (1 - e^(eps - l_i))^+ .
    """

    losses: npt.NDArray[np.float64]
    log_probs: npt.NDArray[np.float64]
    log_inf_mass: float = -math.inf
    description: str = ""

    def log_delta(self, epsilon: float) -> float:
        """Natural log of the hockey-stick divergence at e^epsilon, computed in log space."""
        sel = self.losses > epsilon
        terms = [self.log_inf_mass]
        if np.any(sel):
            loss = self.losses[sel]
            lp = self.log_probs[sel]
            # log(p * (1 - e^(eps - l))) = log p + log(1 - e^(eps - l))
            terms.append(logsumexp(lp + log1mexp(epsilon - loss)))
        return logsumexp(terms)


def mechanisms(rounds: object, what: str = "rounds") -> list[Mechanism]:
    """`rounds` as a list of Mechanism; InvalidParameters for one Mechanism where a list goes
    (one round is [mech]), something not iterable, or an element that is not a Mechanism."""
    if isinstance(rounds, Mechanism) or not isinstance(rounds, Iterable):
        raise InvalidParameters(f"{what} must be a list of Mechanism (one round: [mech])")
    out = list(rounds)
    for m in out:
        if not isinstance(m, Mechanism):
            raise InvalidParameters(f"{what} must be Mechanism, got {type(m).__name__}")
    return out


def ldp_epsilon(rounds: Sequence[Mechanism], counts: Sequence[int] | None = None) -> float:
    """The sum of the rounds' eps0 (each `counts` times): the pure-DP epsilon (delta 0) their
    composition always meets (each report is eps0-LDP; the shuffle post-processes it)."""
    weights = counts if counts is not None else [1] * len(rounds)
    return float(sum(m.eps0 * c for m, c in zip(rounds, weights, strict=True)))


def check_query(
    mech: object,
    epsilon: float | None = None,
    *,
    delta: float | None = None,
    zero_delta: bool = True,
    of: type = Mechanism,
) -> None:
    """InvalidParameters unless `mech` is a Mechanism (or an `of`; not, e.g., a bare (n, k,
    eps0) tuple) and the epsilon (`check_epsilon`) or delta (`check_delta`; 0 allowed with
    `zero_delta`: most bounds answer it with the LDP epsilon) asked about is valid."""
    if not isinstance(mech, of):
        raise InvalidParameters(f"expected a {of.__name__}, got {type(mech).__name__}")
    if epsilon is not None:
        check_epsilon(epsilon)
    if delta is not None:
        check_delta(delta, allow_zero=zero_delta)


def check_epsilon(epsilon: float, *, real_line: bool = False) -> float:
    """epsilon as a float: a finite number >= 0, or with `real_line` any number but NaN (a
    hockey-stick divergence is defined at every e^epsilon); InvalidParameters otherwise."""
    if isinstance(epsilon, bool) or not isinstance(epsilon, numbers.Real):
        raise InvalidParameters(f"epsilon must be a number, got {epsilon!r}")
    e = float(epsilon)
    if math.isnan(e) or not (real_line or (math.isfinite(e) and e >= 0)):
        raise InvalidParameters(f"epsilon must be a finite number >= 0, got {epsilon!r}")
    return e


def check_delta(delta: float, *, allow_zero: bool = False) -> float:
    """delta as a float in (0, 1) ([0, 1) with `allow_zero`); InvalidParameters otherwise."""
    if isinstance(delta, bool) or not isinstance(delta, numbers.Real):
        raise InvalidParameters(f"delta must be a number, got {delta!r}")
    d = float(delta)
    if not (0.0 < d < 1.0 or (allow_zero and d == 0.0)):
        interval = "[0, 1)" if allow_zero else "(0, 1)"
        raise InvalidParameters(f"delta must be a number in {interval}, got {delta!r}")
    return d


def lookup(table: Mapping[str, T], name: str, unknown: str, names: Iterable[str] = ()) -> T:
    """`table[name]`; otherwise InvalidParameters saying `unknown` and the names to choose from
    (`names` in that order, or else the table's sorted)."""
    try:
        return table[name]
    except (KeyError, TypeError):  # TypeError: an unhashable name
        valid = ", ".join(names or sorted(table))
        raise InvalidParameters(f"{unknown}; choose one of {valid}") from None
