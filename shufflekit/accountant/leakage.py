"""What one participant risks in a shuffled k-RR round, as Bayes vulnerability (QIF, seed 004).

The probability that an adversary guesses the target's value in one try: the *outsider*
(uniform prior over every dataset, sees the published counts), the *insider* (knows every other
participant's value; worst case over what they hold: `accountant.leakage_insider`), k-RR alone
(`local_only_vulnerability`) and the shuffle alone. Leakage is against the prior 1/k. Skewed
populations and explicit channels are in `accountant.leakage_channels`. See docs/leakage.md.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from scipy.special import gammaln

from shufflekit.accountant.core import check_query
from shufflekit.accountant.leakage_insider import MAX_EPS0, insider_vulnerability
from shufflekit.accountant.numerics.krr import krr
from shufflekit.accountant.numerics.maxload import expected_max_excess
from shufflekit.base.checks import real, whole
from shufflekit.base.errors import AccuracyError, InvalidParameters

MAX_N_GENERAL_K = 30_000_000
"""Largest cohort evaluated for k >= 3 (the expected maximum load costs about n / 1e6 seconds)."""


def _check(n: int | None, k: int, eps0: float | None = None) -> tuple[Any, int, Any]:
    """(n, k, eps0) as int, int, float (numpy numbers taken; a bool, a float n or k, a string
    refused by name), each None where not given."""
    bad = InvalidParameters
    return (
        None if n is None else whole("n", n, 1, error=bad),
        whole("k", k, 2, error=bad),
        None if eps0 is None else real("eps0", eps0, 0, MAX_EPS0, low_open=True, error=bad),
    )


def central_binomial_ratio(n: int) -> float:
    """a_n = C(n-1, floor((n-1)/2)) / 2^n, the excess of the k = 2 shuffle over 1/2 (Thm 17).

    Gamma(m + 1/2) / (2 sqrt(pi) m!) with m = floor(n/2): a log-gamma difference below m = 1e4
    (relative error ~1e-12), the asymptotic series beyond (~1e-16; gammaln loses digits there).
    """
    m = n // 2
    if m < 10_000:
        return 0.5 * math.exp(float(gammaln(m + 0.5) - gammaln(m + 1.0)) - 0.5 * math.log(math.pi))
    x = 1.0 / m
    series = 1 - x / 8 + x * x / 128 + 5 * x**3 / 1024 - 21 * x**4 / 32768
    return 0.5 * series / math.sqrt(math.pi * m)


def shuffle_only_excess(n: int, k: int) -> float:
    """V_S(n, k) - 1/k: what the shuffle alone leaves to the outsider above chance.

    k = 2: the closed form a_n; k >= 3: (E[max load] - n/k) / n, exact (numerics.maxload).
    """
    n, k, _ = _check(n, k)
    if k == 2:
        return central_binomial_ratio(n)
    if n > MAX_N_GENERAL_K:
        raise AccuracyError(
            f"n = {n} is beyond the {MAX_N_GENERAL_K:,} users evaluated exactly for k >= 3"
        )
    return expected_max_excess(n, k) / n


def shuffle_only_vulnerability(n: int, k: int) -> float:
    """V_S(n, k): the outsider's chance of guessing the target when reports are not randomized."""
    return 1.0 / k + shuffle_only_excess(n, k)


def local_only_vulnerability(k: int, eps0: float) -> float:
    """k-RR alone (no shuffle): the adversary guesses the reported value, right with p (Prop 15)."""
    _, k, eps0 = _check(None, k, eps0)
    return krr(k, eps0).p


def signal_factor(k: int, eps0: float) -> float:
    """p - q = (e^eps0 - 1) / (e^eps0 + k - 1): the share of the shuffle's excess k-RR keeps."""
    r = krr(k, eps0)
    return r.p - r.q


def outsider_excess(n: int, k: int, eps0: float) -> float:
    """V_out - 1/k = (V_S - 1/k) (p - q), factorised so tiny leakages keep their digits."""
    n, k, eps0 = _check(n, k, eps0)
    return shuffle_only_excess(n, k) * signal_factor(k, eps0)


def outsider_vulnerability(n: int, k: int, eps0: float) -> float:
    """V_out(n, k, eps0): an outsider who sees the counts guesses the target's value (eq. 17)."""
    return 1.0 / k + outsider_excess(n, k, eps0)


@dataclass(frozen=True)
class Leakage:
    """One participant's risk in one round of n users, k values, k-RR(eps0), then a shuffle.

    The leakages are the outsider's, against the prior 1/k. `insider_exact` is False where
    `insider_vulnerability` is a sound upper bound rather than the exact worst case.
    """

    n: int
    k: int
    eps0: float
    prior_vulnerability: float
    outsider_vulnerability: float
    insider_vulnerability: float
    insider_exact: bool
    local_only_vulnerability: float
    shuffle_only_vulnerability: float
    multiplicative_leakage: float
    additive_leakage: float

    def as_dict(self) -> dict[str, Any]:
        """Every field, JSON-able."""
        return asdict(self)


def leakage_report(n: int, k: int, eps0: float, *, insider_work: float | None = None) -> Leakage:
    """Every vulnerability of one round (see `Leakage`); `insider_work` caps the exact insider
    computation (elementary steps; beyond it the sound bound is used)."""
    n, k, eps0 = _check(n, k, eps0)
    if insider_work is not None:
        insider_work = real("insider_work", insider_work, 0, error=InvalidParameters)
    s_excess = shuffle_only_excess(n, k)
    add = s_excess * signal_factor(k, eps0)
    v_in, exact = insider_vulnerability(n, k, eps0, max_work=insider_work)
    return Leakage(
        n=n,
        k=k,
        eps0=eps0,
        prior_vulnerability=1.0 / k,
        outsider_vulnerability=1.0 / k + add,
        insider_vulnerability=v_in,
        insider_exact=exact,
        local_only_vulnerability=krr(k, eps0).p,
        shuffle_only_vulnerability=1.0 / k + s_excess,
        multiplicative_leakage=k * (1.0 / k + add),
        additive_leakage=add,
    )


def _fmt(x: float) -> str:
    return f"{x:#.4g}" if x < 0.99995 else f"{x:.6g}"


def participant_statement(
    lk: Leakage, epsilon: float | None = None, delta: float | None = None
) -> str:
    """The participant-facing sentence: both guessing chances, then the DP promise.

    With (epsilon, delta) it says "at most e^epsilon times as likely (plus delta)": a bare
    factor would be false when delta > 0. The e^eps0 cap holds always (each report is eps0-LDP).
    """
    check_query(lk, epsilon, delta=delta, of=Leakage)
    k = lk.k
    words = (
        f"someone who sees the published counts guesses your answer with probability "
        f"{_fmt(lk.outsider_vulnerability)} (chance: 1/{k} = {_fmt(1.0 / k)}); someone who "
        f"knows every other answer, with at most {_fmt(lk.insider_vulnerability)}; "
        "whatever anyone concludes from the counts is "
    )
    cap = f"e^{lk.eps0:.4g} = {math.exp(lk.eps0):.4g}"
    if epsilon is not None and delta is not None and epsilon < lk.eps0:
        words += (
            f"at most e^{epsilon:.4g} = {math.exp(epsilon):.4g} times as likely "
            f"(plus {delta:.3g}) with your answer as with any other, "
            f"and never more than {cap} times as likely"
        )
    else:
        words += f"never more than {cap} times as likely with your answer as with any other"
    return words


def min_cohort(
    k: int,
    eps0: float,
    max_excess: float,
    progress: Callable[[int], None] | None = None,
) -> int:
    """The smallest n whose outsider vulnerability is within `max_excess` of 1/k.

    Assumes V_out is non-increasing in n: proven for k = 2 (constant on pairs 2m, 2m+1, falling
    between them), observed for k >= 3 (tests scan every n up to a few hundred). `progress`
    receives the number of evaluations so far.
    """
    _, k, eps0 = _check(None, k, eps0)
    ok = isinstance(max_excess, numbers.Real) and not isinstance(max_excess, bool)
    if not (ok and max_excess > 0 and math.isfinite(max_excess)):
        raise InvalidParameters(
            f"max_excess, the target excess, must be a number > 0 (got {max_excess!r})"
        )
    calls = [0]

    def gap(n: int) -> float:
        calls[0] += 1
        if progress is not None:
            progress(calls[0])
        return outsider_excess(n, k, eps0) - max_excess

    g_lo = gap(1)
    if g_lo <= 0:
        return 1
    limit = 10**15 if k == 2 else MAX_N_GENERAL_K
    # the excess falls like c / sqrt(n): start from that guess, then bracket it
    c = outsider_excess(1000, k, eps0) * math.sqrt(1000)
    guess = (c / max_excess) ** 2
    refusal = AccuracyError(
        f"no cohort up to {limit:,} users brings the outsider within {max_excess:g} of "
        f"1/{k} (about {guess:,.0f} would be needed); ask for a larger excess"
    )
    if guess > 2 * limit:
        raise refusal
    lo, hi = 1, max(2, min(limit, int(guess)))
    g_hi = gap(hi)
    while g_hi > 0:
        if hi >= limit:
            raise refusal
        lo, g_lo = hi, g_hi
        hi = min(limit, hi * 2)
        g_hi = gap(hi)
    return _regula_falsi(gap, lo, g_lo, hi, g_hi)


def _regula_falsi(gap: Callable[[int], float], lo: int, g_lo: float, hi: int, g_hi: float) -> int:
    """The smallest n in (lo, hi] with gap(n) <= 0, given gap(lo) > 0 >= gap(hi) and gap
    non-increasing: Illinois steps on 1/sqrt(n) (where the gap is nearly linear), a bisection
    whenever they stall, so a handful of evaluations suffice even for n in the millions."""
    kept = 0  # +1: lo was kept last time, -1: hi was kept
    stalls = 0
    while hi - lo > 1:
        if stalls >= 2:
            m = (lo + hi) // 2
            stalls = 0
        else:
            x_lo, x_hi = lo**-0.5, hi**-0.5
            x = x_hi + (0.0 - g_hi) * (x_lo - x_hi) / (g_lo - g_hi)
            m = min(max(round(x**-2), lo + 1), hi - 1)
        width = hi - lo
        g_m = gap(m)
        if g_m > 0:
            lo, g_lo = m, g_m
            if kept == -1:
                g_hi /= 2
            kept = -1
        else:
            hi, g_hi = m, g_m
            if kept == 1:
                g_lo /= 2
            kept = 1
        stalls = stalls + 1 if 2 * (hi - lo) > width else 0
    return hi


ROUND_INSIDER_WORK = 3e6
"""Exact insider work allowed when a round is released (well under a second); bound beyond."""


def round_facts(
    n: int, k: int, eps0: float, epsilon: float | None, delta: float | None
) -> dict[str, float | bool | str]:
    """What a released round's result says about one participant: the prior, the outsider's and
    the insider's vulnerability, whether the insider's is exact, and the sentence with
    (epsilon, delta). Kept quick (the insider's exact work is capped at ROUND_INSIDER_WORK)."""
    r = leakage_report(n, k, eps0, insider_work=ROUND_INSIDER_WORK)
    return {
        "prior_vulnerability": r.prior_vulnerability,
        "outsider_vulnerability": r.outsider_vulnerability,
        "insider_vulnerability": r.insider_vulnerability,
        "insider_exact": r.insider_exact,
        "statement": participant_statement(r, epsilon, delta),
    }


def bayes_equivalent_eps(vulnerability: float, k: int) -> float:
    """The eps0 of a plain k-RR (no shuffle) whose vulnerability equals the given one: an
    average-case summary for comparisons only, NOT a differential-privacy guarantee."""
    if not 1.0 / k <= vulnerability < 1.0:
        raise InvalidParameters(f"a vulnerability in [1/k, 1) is needed (got {vulnerability!r})")
    return math.log(vulnerability * (k - 1) / (1.0 - vulnerability))


def expected_max_normal(k: int) -> float:
    """E[max of k iid standard normals] (0.5642 for k = 2, 1.5388 for k = 10), by quadrature."""
    from scipy import integrate
    from scipy.stats import norm

    value, _ = integrate.quad(
        lambda x: x * k * norm.pdf(x) * norm.cdf(x) ** (k - 1), -math.inf, math.inf
    )
    return float(value)


def approximate_outsider(n: int, k: int, eps0: float | None, method: str = "paper") -> float:
    """Approximations of V_out, for comparison with the exact value only: "paper" is eqs. (15)-(16)
    with f = 1 (1/k + sqrt(ln k / (k n)), a heuristic that over-states the excess by +48 % at
    k = 2); "clt" replaces sqrt(ln k) by E[max of k normals]. eps0 None: the shuffle alone."""
    n, k, eps0 = _check(n, k, eps0)
    if method == "paper":
        c = math.sqrt(math.log(k))
    elif method == "clt":
        c = expected_max_normal(k)
    else:
        raise InvalidParameters(f"unknown approximation {method!r}: paper or clt")
    factor = 1.0 if eps0 is None else signal_factor(k, eps0)
    return 1.0 / k + c / math.sqrt(k * n) * factor
