"""A Rényi-DP privacy filter for budgets whose rounds are chosen adaptively (after seeing earlier
results), where composing the realised sequence of PLDs is not a valid guarantee.

Each round's Rényi curve rho(alpha) comes from the same sound dominating pair the planned mode
composes (its PLD, losses rounded up): rho = log(E_P[e^((alpha-1) L); L finite]) / (alpha-1)
plus the correction for dropping the pair's infinite-loss mass delta0 (a total-variation split).
The pair is symmetric and dominates in hockey-stick divergence at every epsilon, hence in every
f-divergence (Blackwell), so rho bounds the round's Rényi divergence in both directions.

The filter (Feldman and Zrnic 2021; Whitehouse, Ramdas, Rogers and Wu 2023; several orders as in
Lécuyer 2021) admits a round only if, with it, some order alpha in `ORDERS` keeps
    sum_i rho_i(alpha) + log(|ORDERS| / delta_f) / (alpha - 1) <= epsilon_total
and the rounds' delta0 sum stays within `delta_total * INF_SHARE`. For each alpha,
exp((alpha-1)(L_t - sum rho_i(alpha))) is a non-negative supermartingale, so by Ville's
inequality and a union bound over the orders the privacy loss exceeds epsilon_total with
probability at most delta_f; the split-off infinite-loss parts add at most their sum. Both
shares of delta are fixed when the budget is created, so the guarantee (epsilon_total,
delta_total) holds whatever order and types of rounds the operator picks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from shufflekit.accountant.core import PrivacyLossDistribution
from shufflekit.accountant.numerics.logspace import logsumexp
from shufflekit.base.arrays import FloatArray
from shufflekit.base.errors import UnsoundResult

ORDERS: FloatArray = np.array(
    [
        1.25,
        1.5,
        1.75,
        2.0,
        2.5,
        3.0,
        4.0,
        5.0,
        6.0,
        8.0,
        10.0,
        12.0,
        16.0,
        20.0,
        24.0,
        32.0,
        48.0,
        64.0,
        96.0,
        128.0,
        256.0,
        512.0,
    ]
)
_U = 2.0**-53  # the unit round-off of a double
INF_SHARE = 1e-3  # the share of delta_total reserved for the pairs' infinite-loss masses
#: Orders of a planned composition's Rényi bound (`planned_epsilon`): many rounds at a tiny
#: delta want orders far above the filter's (whose grid is fixed in every budget's records).
WIDE_ORDERS: FloatArray = np.geomspace(1.25, 1e5, 160)


def rdp_curve(
    pld: PrivacyLossDistribution, orders: FloatArray = ORDERS
) -> tuple[FloatArray, float]:
    """(rho at each order, delta0): the Rényi curve of the pair's finite-loss part, and the
    mass delta0 of its infinite-loss part (inf when delta0 >= 1/2: no useful curve)."""
    delta0 = math.exp(pld.log_inf_mass) if pld.log_inf_mass > -745 else 0.0
    if delta0 >= 0.5:
        return np.full(orders.shape, math.inf), delta0
    losses = np.asarray(pld.losses, dtype=np.float64)
    lp = np.asarray(pld.log_probs, dtype=np.float64)
    # float round-off, rounded up: the exponents' errors (u per operation on |lp| and
    # |(a-1) L|), numpy's pairwise sum (a relative error of u per level) and the log
    max_lp = float(np.max(np.abs(lp[np.isfinite(lp)]), initial=0.0))
    max_loss = float(np.max(np.abs(losses), initial=0.0))
    levels = 32.0 + math.log2(max(losses.size, 1))
    rho = np.empty(orders.shape)
    for i, a in enumerate(orders):
        log_moment = logsumexp(lp + (a - 1.0) * losses)
        slack = 4.0 * _U * (max_lp + 2.0 * (a - 1.0) * max_loss + levels + abs(log_moment))
        # P' = P_finite / m with m >= 1 - delta0: E_P'[e^((a-1)L')] <= (1-delta0)^(-a) E_P[...]
        r = (log_moment + slack - a * math.log1p(-delta0)) / (a - 1.0)
        rho[i] = r + 4.0 * _U * abs(r)  # the division's and the log1p's rounding
    return np.maximum(rho, 0.0), delta0


def filter_epsilon(rho_sum: FloatArray, delta_total: float, orders: FloatArray = ORDERS) -> float:
    """The epsilon the filter certifies for accumulated Rényi curves `rho_sum` (min over
    orders of rho + log(|orders| / delta_f) / (alpha - 1), delta_f = (1 - INF_SHARE) delta)."""
    delta_f = delta_total * (1.0 - INF_SHARE)
    slack = math.log(len(orders) / delta_f) / (orders - 1.0)
    return float(np.min(rho_sum + slack))


def rdp_epsilon(
    rho_sum: FloatArray, delta0_sum: float, delta: float, orders: FloatArray = ORDERS
) -> float:
    """epsilon at `delta` of a planned (non-adaptive) composition from its summed Rényi curve:
    min over orders of  rho + log((a-1)/a) - (log(delta - delta0_sum) + log a) / (a-1)
    (Canonne, Kamath and Steinke 2020, Prop. 12), the split-off infinite-loss masses paid in
    full; inf when they reach `delta`. The fallback where the PLD composition's numerics cannot
    certify a tiny delta: RDP adds curves exactly, at the price of a looser conversion."""
    if not delta0_sum < delta:
        return math.inf
    log_d = math.log(delta - delta0_sum)
    eps = rho_sum + np.log((orders - 1.0) / orders) - (log_d + np.log(orders)) / (orders - 1.0)
    if np.isnan(eps).any():  # max(0, nan) is 0: a broken curve would read as free
        raise UnsoundResult("a Rényi curve is NaN (a pair broke its contract): no epsilon")
    return max(0.0, float(np.min(eps)))


def planned_epsilon(
    plds: Sequence[PrivacyLossDistribution], counts: Sequence[int], delta: float
) -> float:
    """epsilon at `delta` of `counts[i]` rounds of each dominating pair `plds[i]`, composed in
    a fixed order, by their Rényi curves over `WIDE_ORDERS` (`rdp_epsilon`); inf where the
    pairs' infinite-loss masses reach `delta`."""
    rho = np.zeros(WIDE_ORDERS.size)
    delta0 = 0.0
    for p, c in zip(plds, counts, strict=True):
        r, d = rdp_curve(p, WIDE_ORDERS)
        rho, delta0 = rho + c * r, delta0 + c * d
    return rdp_epsilon(rho, delta0, delta, WIDE_ORDERS)


def inf_budget(delta_total: float) -> float:
    """The most the rounds' infinite-loss masses may add up to."""
    return delta_total * INF_SHARE


def accumulate(curves: Sequence[tuple[FloatArray, float]]) -> tuple[FloatArray, float]:
    """Sum of Rényi curves and of delta0 over rounds (zeros for none)."""
    rho = np.zeros(ORDERS.shape)
    d0 = 0.0
    for r, d in curves:
        rho = rho + r
        d0 += d
    return rho, d0
