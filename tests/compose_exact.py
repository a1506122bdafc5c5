"""Exact references for the composition tests, computed independently (log space, no grid):
binary randomized response and two-point pairs (sums of binomials), the Gaussian mechanism
(closed form), a blanket-like pair; and the two engines every test runs."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from scipy.optimize import brentq
from scipy.special import gammaln, log_ndtr
from scipy.stats import binom

from shufflekit.accountant.core import PrivacyLossDistribution

ENGINES = ["dp_accounting", "fft"]


# ----------------------------------------------------------------------------- exact references


def two_point(a: float, b: float) -> PrivacyLossDistribution:
    """P = (a, 1-a), Q = (b, 1-b)."""
    return PrivacyLossDistribution(
        np.array([math.log(a / b), math.log((1 - a) / (1 - b))]),
        np.array([math.log(a), math.log1p(-a)]),
    )


def rr(eps0: float) -> PrivacyLossDistribution:
    p = 1.0 / (1.0 + math.exp(-eps0))
    return two_point(p, 1.0 - p)


def exact_log_delta(pairs: list[tuple[float, float, int]], eps: float, d_inf: float = 0.0) -> float:
    """Exact log delta of composing counts c of two-point pairs (a, b) (no grid, log space)."""
    losses = np.zeros(1)
    lps = np.zeros(1)
    for a, b, c in pairs:
        j = np.arange(c + 1)
        l1, l2 = math.log(a / b), math.log((1 - a) / (1 - b))
        lo = j * l1 + (c - j) * l2
        lp = (
            gammaln(c + 1)
            - gammaln(j + 1)
            - gammaln(c - j + 1)
            + j * math.log(a)
            + (c - j) * math.log1p(-a)
        )
        losses = (losses[:, None] + lo[None, :]).ravel()
        lps = (lps[:, None] + lp[None, :]).ravel()
    sel = losses > eps
    if not np.any(sel):
        return -math.inf
    t = lps[sel] + np.log(-np.expm1(eps - losses[sel]))
    m = float(t.max())
    return m + math.log(float(np.sum(np.exp(t - m))))


def exact_eps(log_delta_fn: Callable[[float], float], delta: float, hi: float = 60.0) -> float:
    ld = math.log(delta)
    if log_delta_fn(0.0) <= ld:
        return 0.0
    return float(brentq(lambda e: log_delta_fn(e) - ld, 0.0, hi, xtol=1e-12))


def gauss_log_delta(s: float, eps: float) -> float:
    """Gaussian mechanism with sensitivity/sigma = s."""
    la = log_ndtr(s / 2 - eps / s)
    lb = log_ndtr(-s / 2 - eps / s)
    return float(la + math.log1p(-math.exp(eps + lb - la)))


def gaussian_pld(sigma: float, h: float = 1e-3, width: float = 14.0) -> PrivacyLossDistribution:
    """Dominating discrete PLD of the Gaussian mechanism: the loss L ~ N(mu, 2 mu), mu =
    1/(2 sigma^2); each interval (l_{i-1}, l_i] of its law is put at l_i (rounding up), mass
    below l_0 at l_0, mass above the last point at +inf. The grid h is not a multiple of the
    engines' steps, so their rounding is exercised."""
    mu = 1.0 / (2 * sigma**2)
    sd = math.sqrt(2 * mu)
    edges = np.arange(mu - width * sd, mu + width * sd, h * math.pi / 3)  # irrational spacing
    z = (edges - mu) / sd
    # log P(L in (l_{i-1}, l_i]) in log space (tails far below float range)
    lcdf, lsf = log_ndtr(z), log_ndtr(-z)
    upper_tail = z[1:] > 0
    with np.errstate(divide="ignore"):
        lm_up = lsf[:-1] + np.log1p(-np.exp(np.minimum(lsf[1:] - lsf[:-1], 0.0)))
        lm_dn = lcdf[1:] + np.log1p(-np.exp(np.minimum(lcdf[:-1] - lcdf[1:], 0.0)))
    lmass = np.concatenate([[lcdf[0]], np.where(upper_tail, lm_up, lm_dn)])
    keep = np.isfinite(lmass)
    log_inf = float(lsf[-1])
    return PrivacyLossDistribution(edges[keep], lmass[keep], log_inf)


def blanket_like(n_blanket: int, eps0: float) -> PrivacyLossDistribution:
    """A shuffle-shaped PLD: the target's binary RR report hidden among Bin(N, 1/2) blanket
    reports (the count of ones is released). Exact pair, truncated at +-12 sd with the dropped
    mass counted as infinite loss."""
    p1 = 1.0 / (1.0 + math.exp(-eps0))
    sd = math.sqrt(n_blanket) / 2
    lo = max(0, int(n_blanket / 2 - 12 * sd))
    hi = min(n_blanket + 1, int(n_blanket / 2 + 12 * sd))
    h = np.arange(lo, hi + 1)
    lb1 = binom.logpmf(h - 1, n_blanket, 0.5)
    lb0 = binom.logpmf(h, n_blanket, 0.5)
    lp = np.logaddexp(math.log(p1) + lb1, math.log1p(-p1) + lb0)
    lq = np.logaddexp(math.log1p(-p1) + lb1, math.log(p1) + lb0)
    ok = np.isfinite(lp)
    tail = float(binom.sf(hi - 1, n_blanket, 0.5) + binom.cdf(lo - 1, n_blanket, 0.5))
    return PrivacyLossDistribution(lp[ok] - lq[ok], lp[ok], math.log(tail + 1e-300))
