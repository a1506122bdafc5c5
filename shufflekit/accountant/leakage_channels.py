"""Leakage through explicit channels: a brute-force QIF evaluator for tiny n and k (the tests'
independent check of every formula in `accountant.leakage`), and skewed population priors.

A channel is a matrix C[x, y] = P(y | x) over the k^n datasets x (x_0 is the target, most
significant digit); the gain is g_T(w, x) = [x_0 = w] (guess the target's value). Vulnerability
before and after (Defs 1-2 of seed 004), leakage, and channel equivalence (same vulnerability for
every prior and gain: equal reduced forms).
"""

from __future__ import annotations

import itertools
import math
from collections import Counter

import numpy as np
from scipy.special import gammaln

from shufflekit.base.arrays import FloatArray
from shufflekit.base.errors import AccuracyError, InvalidParameters

MAX_DATASETS = 20_000
"""k^n beyond this is refused by the brute-force builders (matrices are k^n x k^n)."""

MAX_HISTOGRAMS = 3_000_000
"""Histograms enumerated at most by `population_vulnerability`."""


def _guard(n: int, k: int) -> None:
    if n < 1 or k < 2:
        raise InvalidParameters("need n >= 1 and k >= 2")
    if k**n > MAX_DATASETS:
        raise AccuracyError(f"{k}^{n} datasets is too many for a brute-force channel")


def datasets(n: int, k: int) -> list[tuple[int, ...]]:
    """Every dataset, in np.kron order (x_0 the most significant digit)."""
    return list(itertools.product(range(k), repeat=n))


def histogram(x: tuple[int, ...], k: int) -> tuple[int, ...]:
    """How many entries of x hold each value."""
    c = [0] * k
    for v in x:
        c[v] += 1
    return tuple(c)


def krr_matrix(k: int, p: float) -> FloatArray:
    """The k x k k-RR channel: p on the diagonal, (1-p)/(k-1) elsewhere."""
    off = (1.0 - p) / (k - 1)
    return np.full((k, k), off) + np.eye(k) * (p - off)


def full_krr(n: int, k: int, p: float) -> FloatArray:
    """N = R (x) ... (x) R: every user randomizes independently (Def 10)."""
    _guard(n, k)
    m = np.array([[1.0]])
    for _ in range(n):
        m = np.kron(m, krr_matrix(k, p))
    return m


def full_shuffle(n: int, k: int) -> FloatArray:
    """S: a uniformly random permutation of the dataset (Def 7)."""
    _guard(n, k)
    hs = [histogram(x, k) for x in datasets(n, k)]
    count = Counter(hs)
    return np.array([[1.0 / count[a] if a == b else 0.0 for b in hs] for a in hs])


def reduced_shuffle(n: int, k: int) -> FloatArray:
    """S^r: the dataset's histogram, deterministically (Def 8; equivalent to S, Prop 9)."""
    _guard(n, k)
    xs = datasets(n, k)
    hs = sorted(set(histogram(x, k) for x in xs))
    col = {h: i for i, h in enumerate(hs)}
    out = np.zeros((len(xs), len(hs)))
    for i, x in enumerate(xs):
        out[i, col[histogram(x, k)]] = 1.0
    return out


def target_gain(n: int, k: int) -> FloatArray:
    """G[w, x] = 1 if the target x_0 equals the guess w (Def 13)."""
    g = np.zeros((k, k**n))
    for j, x in enumerate(datasets(n, k)):
        g[x[0], j] = 1.0
    return g


def prior_vulnerability(prior: FloatArray, gain: FloatArray) -> float:
    """V_g(pi) = max_w sum_x pi_x g(w, x) (Def 1)."""
    return float(np.max(gain @ prior))


def posterior_vulnerability(prior: FloatArray, channel: FloatArray, gain: FloatArray) -> float:
    """V_g[pi > C] = sum_y max_w sum_x pi_x C[x, y] g(w, x) (Def 2)."""
    return float(np.sum(np.max(gain @ (prior[:, None] * channel), axis=0)))


def uniform_prior(n: int, k: int) -> FloatArray:
    """The outsider's prior: every dataset equally likely."""
    return np.full(k**n, 1.0 / k**n)


def insider_prior(others: tuple[int, ...], k: int) -> FloatArray:
    """The insider's prior: the others hold `others`; the target is uniform over k values."""
    n = len(others) + 1
    prior = np.zeros(k**n)
    index = {x: i for i, x in enumerate(datasets(n, k))}
    for v in range(k):
        prior[index[(v, *others)]] = 1.0 / k
    return prior


def reduced_form(c: FloatArray, tol: float = 1e-9) -> tuple[list[FloatArray], list[float]]:
    """Zero columns dropped, proportional columns merged (weights summed): equivalent channels
    on the same input have the same reduced form up to column order."""
    w = c.sum(axis=0)
    keep = w > tol
    cols: list[FloatArray] = []
    wts: list[float] = []
    for d, wt in zip((c[:, keep] / w[keep]).T, w[keep], strict=True):
        for i, e in enumerate(cols):
            if float(np.max(np.abs(e - d))) < tol:
                wts[i] += float(wt)
                break
        else:
            cols.append(d)
            wts.append(float(wt))
    return cols, wts


def equivalent(c1: FloatArray, c2: FloatArray, tol: float = 1e-9) -> bool:
    """Same vulnerability under every prior and gain function (equal reduced forms)."""
    a, wa = reduced_form(c1, tol)
    b, wb = reduced_form(c2, tol)
    if len(a) != len(b):
        return False
    used = [False] * len(b)
    for d, wt in zip(a, wa, strict=True):
        hit = next(
            (
                j
                for j in range(len(b))
                if not used[j] and float(np.max(np.abs(b[j] - d))) < tol and abs(wb[j] - wt) < tol
            ),
            None,
        )
        if hit is None:
            return False
        used[hit] = True
    return True


# ---------------------------------------------------------------- skewed population priors


def _compositions(n: int, d: int) -> np.ndarray:
    """Every histogram of n into d cells, one per row."""
    if d == 1:
        return np.array([[n]])
    rows = [
        np.column_stack([np.full(len(rest), a), rest])
        for a in range(n, -1, -1)
        for rest in [_compositions(n - a, d - 1)]
    ]
    return np.vstack(rows)


def population_vulnerability(n: int, prior: FloatArray, channel: FloatArray) -> float:
    """The outsider's vulnerability when every value is drawn iid from `prior` (length k) and each
    user applies `channel` (k x d, rows summing to 1), then a shuffle (seed 004's generalisation):
    E_z[max_w sum_j (z_j / n) prior_w R[w, j] / (prior R)_j], z ~ Multinomial(n, prior R).
    Exact, by every histogram z; refused beyond MAX_HISTOGRAMS of them.
    """
    pi = np.asarray(prior, dtype=float)
    r = np.asarray(channel, dtype=float)
    if n < 1 or pi.ndim != 1 or r.ndim != 2 or r.shape[0] != pi.size:
        raise InvalidParameters("need n >= 1, a prior of length k and a k x d channel")
    if np.any(pi < 0) or abs(pi.sum() - 1) > 1e-9 or np.any(r < 0):
        raise InvalidParameters("the prior must be a probability vector, the channel >= 0")
    if np.any(np.abs(r.sum(axis=1) - 1) > 1e-9):
        raise InvalidParameters("each row of the channel must sum to 1")
    d = r.shape[1]
    if math.comb(n + d - 1, d - 1) > MAX_HISTOGRAMS:
        raise AccuracyError(
            f"{math.comb(n + d - 1, d - 1):,} histograms of {n} reports into {d} values: too many"
        )
    out = pi @ r
    post = (pi[:, None] * r) / np.where(out > 0, out, 1.0)[None, :]  # P(x0 = w | report j)
    z = _compositions(n, d).astype(float)
    with np.errstate(divide="ignore"):
        log_out = np.log(out)
    log_pmf = gammaln(n + 1) - gammaln(z + 1).sum(axis=1)
    log_pmf += np.where(z > 0, z * log_out[None, :], 0.0).sum(axis=1)
    guess = np.max((z / n) @ post.T, axis=1)
    return float(np.sum(np.exp(log_pmf) * guess))


def histograms(n: int, k: int) -> list[tuple[int, ...]]:
    """Every histogram of n values into k cells, in the column order of `reduced_shuffle`."""
    _guard(n, k)
    return sorted(set(histogram(x, k) for x in datasets(n, k)))


def reduced_krr(n: int, k: int, p: float) -> FloatArray:
    """N^r (Def 23, App. A): histogram -> histogram, the law of the reports' histogram given the
    values' histogram (the same for every dataset with that histogram, Lemma 30). Rows sum to 1;
    the paper's Table IV divides some entries by 3 (an erratum: its rows would not)."""
    xs = datasets(n, k)
    hs = histograms(n, k)
    row = {h: i for i, h in enumerate(hs)}
    first: dict[tuple[int, ...], int] = {}
    for i, x in enumerate(xs):
        first.setdefault(histogram(x, k), i)
    rows = np.array([first[h] for h in hs], dtype=np.int64)
    out: FloatArray = full_krr(n, k, p)[rows] @ reduced_shuffle(n, k)
    assert out.shape == (len(hs), len(row))
    return out
