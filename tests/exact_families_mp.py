"""High-precision oracle: the exact privacy curve of the worst dataset families of shuffled k-RR
("all others at x0", "all others at z"), in 80-digit mpmath, independent of the accountant.

Any sound upper bound on the tight delta(eps) must dominate the hockey-stick divergence of every
explicit dataset. delta = sum over histograms h of (P(h | x0) - e^eps P(h | x1))^+ is a sum of
non-negative terms, so summing over a subset of histograms (the counts of the rare reports
capped at `cap`) gives a LOWER bound on that dataset's delta: truncation never makes this oracle
overstate what is proven. The floats eps0 and eps are converted exactly (mpf of a double).

Only mpmath is used: the k-RR probabilities, multinomial laws and hockey-stick sums are written
out here from their definitions (no formula of the accountant).
"""

from __future__ import annotations

import itertools
from functools import lru_cache

import mpmath

DPS = 80


def _probs(k: int, eps0: float) -> tuple[mpmath.mpf, mpmath.mpf]:
    """(p, q) of k-RR(eps0) over k values, in high precision."""
    e0 = mpmath.exp(mpmath.mpf(eps0))
    q = 1 / (e0 + k - 1)
    return e0 * q, q


@lru_cache(maxsize=256)
def _lfact(m: int) -> mpmath.mpf:
    return mpmath.loggamma(m + 1)


def _multinomial(counts: tuple[int, ...], probs: tuple[mpmath.mpf, ...]) -> mpmath.mpf:
    """Multinomial probability of `counts` (total = sum) with cell probabilities `probs`."""
    if any(c < 0 for c in counts):
        return mpmath.mpf(0)
    log = _lfact(sum(counts))
    for c, pr in zip(counts, probs, strict=True):
        if c == 0:
            continue
        if pr == 0:
            return mpmath.mpf(0)
        log += c * mpmath.log(pr) - _lfact(c)
    return mpmath.exp(log)


def family_delta(
    n: int, k: int, eps0: float, eps: float, family: str, *, cap: int = 30
) -> tuple[mpmath.mpf, mpmath.mpf]:
    """(H(P_x0 || P_x1), H(P_x1 || P_x0)) of one dataset at e^eps, as lower bounds (exact up to
    the rare counts above `cap`, whose non-negative terms are left out).

    family "x0": the other n-1 users all hold x0; "z" (k >= 3): they all hold a third value z.
    Cells of the histogram: (x0, x1, z, the rest merged) -- the rest's split is uniform under
    both hypotheses, so merging it is a sufficient reduction.
    """
    with mpmath.workdps(DPS):
        p, q = _probs(k, eps0)
        ee = mpmath.exp(mpmath.mpf(eps))
        if family == "x0":
            other = (p, q, mpmath.mpf(0), (k - 2) * q)  # (x0, x1, z, rest) for one other user
        elif family == "z":
            if k < 3:
                raise ValueError("family z needs k >= 3")
            other = (q, q, p, (k - 3) * q)
        else:
            raise ValueError(f"unknown family {family!r}")
        # the target's report in the same cells (x0, x1, z, rest) under x0; under x1 swap them
        t0 = (p, q, mpmath.mpf(0), (k - 2) * q) if family == "x0" else (p, q, q, (k - 3) * q)
        t1 = (q, p, t0[2], t0[3])
        big = 0 if family == "x0" else 2  # the cell holding most reports
        rare = [i for i in range(4) if i != big and (other[i] or t0[i] or t1[i])]
        m = n - 1
        fwd = mpmath.mpf(0)
        bwd = mpmath.mpf(0)
        cap_m = min(cap, n)
        for rc in itertools.product(range(cap_m + 1), repeat=len(rare)):
            if sum(rc) > n:
                continue
            h = [0, 0, 0, 0]
            for i, c in zip(rare, rc, strict=True):
                h[i] = c
            h[big] = n - sum(rc)
            px0 = mpmath.mpf(0)
            px1 = mpmath.mpf(0)
            for cell in range(4):
                if h[cell] == 0 or (t0[cell] == 0 and t1[cell] == 0):
                    continue
                prev = list(h)
                prev[cell] -= 1
                if sum(prev) != m:
                    continue
                o = _multinomial(tuple(prev), other)
                px0 += t0[cell] * o
                px1 += t1[cell] * o
            fwd += max(mpmath.mpf(0), px0 - ee * px1)
            bwd += max(mpmath.mpf(0), px1 - ee * px0)
        return fwd, bwd


def best_family_delta(n: int, k: int, eps0: float, eps: float, *, cap: int = 30) -> mpmath.mpf:
    """The largest delta of the families above, both orders: a proven lower bound on the tight
    delta(eps) of shuffled k-RR at (n, k, eps0)."""
    fams = ["x0", "z"] if k >= 3 else ["x0"]
    return max(max(family_delta(n, k, eps0, eps, f, cap=cap)) for f in fams)


def ldp_delta(k: int, eps0: float, eps: float) -> mpmath.mpf:
    """delta(eps) of k-RR alone, p - e^eps q (for eps < eps0): an upper bound on every dataset's
    delta after the shuffle (post-processing)."""
    with mpmath.workdps(DPS):
        p, q = _probs(k, eps0)
        return max(mpmath.mpf(0), p - mpmath.exp(mpmath.mpf(eps)) * q)


def k2_all_at_x0(n: int, eps0: float, eps: float, *, sds: float = 10.0) -> tuple[mpmath.mpf, ...]:
    """k = 2 at any n: (H(P_x0 || P_x1), H(P_x1 || P_x0)) of "all others at x0", summed over the
    counts within `sds` standard deviations of the mode (a subset of non-negative terms: lower
    bounds, exact to ~1e-20 relative for sds = 10). S = A + target, A ~ Bin(n-1, p):
    P(S = s | x0) = p b(s-1) + q b(s), P(S = s | x1) = q b(s-1) + p b(s); b by its ratio
    recurrence from the mode, in 40 digits. The two laws do not depend on eps: they are kept
    (`_k2_x0_laws`) for the next eps at the same (n, eps0, sds)."""
    with mpmath.workdps(40):
        ee = mpmath.exp(mpmath.mpf(eps))
        fwd = mpmath.mpf(0)
        bwd = mpmath.mpf(0)
        zero = mpmath.mpf(0)
        for px0, px1 in _k2_x0_laws(n, eps0, sds):
            fwd += max(zero, px0 - ee * px1)
            bwd += max(zero, px1 - ee * px0)
        return fwd, bwd


@lru_cache(maxsize=4)
def _k2_x0_laws(n: int, eps0: float, sds: float) -> tuple[tuple[mpmath.mpf, mpmath.mpf], ...]:
    """(P(S = s | x0), P(S = s | x1)) for s over the window of `k2_all_at_x0`, in 40 digits."""
    with mpmath.workdps(40):
        p, q = _probs(2, eps0)
        big = n - 1
        mode = int(mpmath.floor((big + 1) * p))
        half = int(sds * mpmath.sqrt(big * p * q)) + 2
        lo, hi = max(0, mode - half), min(big, mode + half)
        b = {
            mode: mpmath.exp(
                _lfact(big)
                - _lfact(mode)
                - _lfact(big - mode)
                + mode * mpmath.log(p)
                + (big - mode) * mpmath.log(q)
            )
        }
        ratio = p / q
        for s in range(mode, hi):
            b[s + 1] = b[s] * (big - s) / (s + 1) * ratio
        for s in range(mode, lo, -1):
            b[s - 1] = b[s] * s / (big - s + 1) / ratio
        zero = mpmath.mpf(0)
        laws = []
        for s in range(lo, hi + 2):
            prev, cur = b.get(s - 1, zero), b.get(s, zero)
            laws.append((p * prev + q * cur, q * prev + p * cur))
        return tuple(laws)
