"""The k-RR probabilities, defined once: every bound, pair and dataset law of the accountant
reads p, q, gamma (and their logs) from here, so they agree to the last bit."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True)
class KRR:
    """k-RR(eps0) over k values: report the true value with probability p = e^eps0/(e^eps0+k-1),
    each other value with q = 1/(e^eps0+k-1); equivalently, with probability gamma = k q report
    a uniform value (the privacy blanket), otherwise the true one."""

    k: int
    eps0: float
    p: float
    q: float
    gamma: float
    log_norm: float  # log(e^eps0 + k - 1): log p = eps0 - log_norm, log q = -log_norm
    one_minus_gamma: float  # 1 - gamma = p - q = (e^eps0 - 1) q, without cancellation
    one_minus_p: float  # 1 - p = (k - 1) q: p itself rounds towards 1 from eps0 ~ 25


@lru_cache(maxsize=1024)
def krr(k: int, eps0: float) -> KRR:
    """The probabilities of k-RR(eps0) over k values (cached: they are asked for constantly)."""
    e0 = math.exp(eps0)
    q = 1.0 / (e0 + k - 1)
    return KRR(
        k=k,
        eps0=eps0,
        p=e0 * q,
        q=q,
        gamma=k * q,
        log_norm=math.log(e0 + k - 1),
        one_minus_gamma=math.expm1(eps0) * q,
        one_minus_p=(k - 1) * q,
    )


def log_ldp_delta(rr: KRR, eps: float) -> float:
    """log of k-RR's own delta(eps) = p - e^eps q = p (1 - e^(eps - eps0)) for eps < eps0, in a
    form without cancellation near eps0 (-inf from eps0 on). It bounds the delta of every
    dataset after a shuffle (post-processing), and is the event bound's factor p - e^eps q."""
    if eps >= rr.eps0:
        return -math.inf
    return math.log(rr.p) + math.log(-math.expm1(eps - rr.eps0))
