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


@lru_cache(maxsize=1024)
def krr(k: int, eps0: float) -> KRR:
    """The probabilities of k-RR(eps0) over k values (cached: they are asked for constantly)."""
    e0 = math.exp(eps0)
    q = 1.0 / (e0 + k - 1)
    return KRR(k=k, eps0=eps0, p=e0 * q, q=q, gamma=k * q, log_norm=math.log(e0 + k - 1))
