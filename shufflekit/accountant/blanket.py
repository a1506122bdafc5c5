"""Privacy-blanket bounds of Koskela, Heikkilä, Honkela (Theorems 8, 10, 11), computed exactly:
published sound upper bounds, offered beside `tight` so users can compare.

Write k-RR(eps0) as: with probability gamma = k/(e^eps0 + k - 1) report a uniform value (the
"blanket"), otherwise the true value. Two adversaries STRONGER than ours (they see the view of
our strong adversary plus blanket bits), so the exact delta of their views is an upper bound on
the histogram's delta (our view is a post-processing of theirs):

`blanket-strong` (adversary A_s, Theorem 8; Balle et al. 2019's analysis): also knows which
users blanketed, the target included, and conditions on the target NOT blanketing. With
p = gamma/k, (N1 - 1, N2, rest) ~ Multinomial(n-1; p, p, 1-2p) JOINTLY (not two independent
binomials), P_s = law of (N1, N2) when the target holds x0, Q_s the same with the roles of the
bins exchanged, loss log(N1/N2). Given T = N1 + N2 - 1 ~ Bin(n-1, 2p) (same law under P and Q,
observed), it is the clone pair with q = 1: P_t = Bin(t, 1/2) + 1 vs Q_t = Bin(t, 1/2), which has
a closed-form hockey-stick. delta_t is non-increasing in t (one more blanket message is a
common post-processing), which bounds the truncated tails.
  - `form="hockey"` (default): the hockey-stick divergence, Koskela et al.'s eq. (2.3) (what
    their code computes; the tight delta of the pair).
  - `form="tail"`: P(L >= eps), eq. (2.4), literally as Theorem 8 prints it: also sound, looser.
  - `beta_mixture=True`: the exact A_s view, where with probability gamma the target blanketed
    and the loss is 0: delta = (1-gamma) * delta_pair. Tighter, still an upper bound. Default
    False (the paper's pair).
  The A_s loss is not bounded by eps0 (up to log n), so delta(eps0) > 0: the LDP cap matters.

`blanket-weak` (adversary A_w, Theorem 10/11; the design note's "blanket with the others'
blanket bits revealed"): knows which OTHER users blanketed, not the target's bit. Given
B = b ~ Bin(n-1, gamma) blanket messages, the view is the multiset of the b uniform messages
and the target's k-RR report; the likelihood ratio depends only on the counts (n1, n2) of
bins x0, x1 (App. A, exact JOINT law). Conditioning further on S = n1 + n2 (same law under both
hypotheses: S = Bin(b, 2/k) + Bern(1 - gamma + 2 gamma/k)), n1 is again a clone pair:
    P = q' (B'+1) + (1-q') B',  Q = (1-q') (B'+1) + q' B',  B' ~ Bin(s-1, 1/2),
    q' = rho_s q1 + (1 - rho_s)/2,  q1 = (1-gamma+gamma/k) / (1-gamma+2 gamma/k),
    rho_s = P(target's report in {x0, x1} | S = s).
delta_b is non-increasing in b (one more blanket message is a post-processing), so the sum over
b is bucketed: each bucket is evaluated at its smallest b (upper bound) and largest b (lower
estimate), and buckets are split until the two agree to `rel_tol`. |loss| <= eps0 here.
The tail form (eq. 2.4, Theorem 11 literally) is available too; it is not monotone in b, so it
sums every b of a window (slower).

Reading warnings (seed-002 note, section 2.3): reading N1, N2 in Theorems 8 and 10 as
independent binomials UNDER-estimates delta for A_w and is not implemented.

Reproduced: the Fig. 1 setting of Koskela et al. (n = 1000, gamma = 0.25, k = 4), see
tests/test_bounds_published.py. Soundness: `Soundness.SOUND_UPPER` for both (and every form),
checked against the brute-force tight delta for n <= 10. All results are capped by the LDP
bound (`accountant.ldp`); the PLDs (for composition) are not capped.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np
from scipy import special

from shufflekit.accountant.clone_pair import (
    Bounds,
    MixtureResult,
    add_clone_mixture_atoms,
    bucketed_mixture_log_delta,
    clone_mixture_atoms,
    clone_mixture_log_delta,
    clone_pair_log_delta,
    mixture_log_delta,
)
from shufflekit.accountant.core import (
    Mechanism,
    PrivacyLossDistribution,
    PrivacyResult,
    check_query,
)
from shufflekit.accountant.ldp import Label, delta_result, solved_epsilon_result
from shufflekit.accountant.numerics.binomial import log_cdf, log_pmf, log_sf, sd_window, sd_windows
from shufflekit.accountant.numerics.grid import LossBinner
from shufflekit.accountant.numerics.logspace import NEG_INF, logsumexp
from shufflekit.base.arrays import FloatArray, IntArray
from shufflekit.base.errors import InvalidParameters

STRONG = "blanket-strong"
WEAK = "blanket-weak"
SUMMARY_STRONG = "Koskela et al. Thm 8 blanket pair (target's blanket bit known), hockey-stick"
SUMMARY_WEAK = "Koskela et al. Thm 10 blanket pair (others' blanket bits known), joint law"
SUMMARY_STRONG_TAIL = "Koskela et al. Thm 8 literally: tail P(L >= eps) of the A_s pair (looser)"
SUMMARY_STRONG_EXACT = (
    "Koskela et al. A_s with the target's blanket bit (exact A_s view), hockey-stick"
)
SUMMARY_WEAK_TAIL = (
    "Koskela et al. Thm 10/11 literally: tail P(L >= eps) of the A_w pair (looser, slow)"
)

_FORMS = ("hockey", "tail")
_FORM_TEXT = {"hockey": "hockey-stick (eq. 2.3)", "tail": "tail P(L >= eps) (eq. 2.4, as printed)"}


def _check_form(form: str) -> None:
    if form not in _FORMS:
        raise InvalidParameters(f"form must be one of {_FORMS}, got {form!r}")


# ----------------------------------------------------------------------------- strong (Thm 8)


def strong_log_delta(
    mech: Mechanism,
    epsilon: float,
    *,
    form: str = "hockey",
    beta_mixture: bool = False,
    stop_below: float = NEG_INF,
) -> MixtureResult:
    """log delta(epsilon) of the A_s pair (Theorem 8), uncapped."""
    _check_form(form)
    shift = math.log1p(-mech.gamma) if beta_mixture else 0.0
    p2 = 2.0 * (mech.gamma / mech.k)
    return clone_mixture_log_delta(
        mech.n - 1, p2, 1.0, epsilon, tail=form == "tail", shift=shift, stop_below=stop_below
    )


def strong_delta(
    mech: Mechanism, epsilon: float, *, form: str = "hockey", beta_mixture: bool = False
) -> PrivacyResult:
    """delta(epsilon) of `blanket-strong` (Koskela et al. Theorem 8), capped by LDP."""

    def log_delta() -> MixtureResult:
        return strong_log_delta(mech, epsilon, form=form, beta_mixture=beta_mixture)

    details = {"form": form, "beta_mixture": beta_mixture}
    return _delta(mech, epsilon, log_delta, _strong_label(form, beta_mixture), details, "t_window")


def strong_epsilon(
    mech: Mechanism, delta: float, *, form: str = "hockey", beta_mixture: bool = False
) -> PrivacyResult:
    """epsilon(delta) of `blanket-strong` (Koskela et al. Theorem 8), capped by LDP."""

    def log_delta(e: float, log_t: float) -> MixtureResult:
        return strong_log_delta(
            mech, e, form=form, beta_mixture=beta_mixture, stop_below=log_t - 5.0
        )

    details = {"form": form, "beta_mixture": beta_mixture}
    return _epsilon(mech, delta, log_delta, _strong_label(form, beta_mixture), details)


def strong_pld(
    mech: Mechanism, *, beta_mixture: bool = False, tau: float = 1e-15, grid: float | None = None
) -> PrivacyLossDistribution:
    """PLD of the A_s pair (dominating pair for composition; NOT LDP-capped).

    Truncated mass counts as infinite loss; with `grid`, losses are rounded up and merged.
    """
    check_query(mech)
    n, gamma = mech.n, mech.gamma
    shift = math.log1p(-gamma) if beta_mixture else 0.0
    acc = clone_mixture_atoms(n - 1, 2.0 * gamma / mech.k, 1.0, tau=tau, grid=grid, shift=shift)
    if beta_mixture:
        acc.add(np.zeros(1), np.array([math.log(gamma)]))
    return acc.build(
        f"Koskela et al. Thm 8 pair (A_s{', exact with target blanket bit' if beta_mixture else ''}"
        f"), n={n}, k={mech.k}, eps0={mech.eps0:g}"
        + (f", losses rounded up to a {acc.step:g} grid" if acc.step else "")
        + "; truncated mass counted as infinite loss"
    )


def _strong_label(form: str, beta_mixture: bool) -> Label:
    _check_form(form)
    what = _FORM_TEXT[form]
    extra = ", exact A_s with the target's blanket bit" if beta_mixture else ""
    return Label(STRONG, f"Koskela et al. Thm 8 pair{extra}, {what}; joint multinomial law")


# ----------------------------------------------------------------------------- weak (Thm 10)


def _weak_s_terms(
    mech: Mechanism, b: IntArray, s: IntArray
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """log P(S = s | B = b), q'_s of the conditional clone pair and 1 - q'_s (elementwise,
    s >= 1). 1 - q1 = (gamma/k)/pi is computed as such: q1 is within gamma/k of 1, and the
    float 1 - q1 loses every digit as eps0 grows (gamma ~ k e^-eps0)."""
    gamma, k = mech.gamma, mech.k
    pi = 1.0 - gamma + 2.0 * gamma / k
    q1 = (1.0 - gamma + gamma / k) / pi
    q1c = (gamma / k) / pi
    if k == 2:
        ls = np.where(s == b + 1, 0.0, NEG_INF)
        return ls, np.full(s.shape, q1), np.full(s.shape, q1c)
    p2 = 2.0 / k
    la = math.log(pi) + log_pmf(s - 1, b, p2)
    lb = math.log(gamma * (k - 2) / k) + log_pmf(s, b, p2)  # 1 - pi, without cancellation
    ls = np.logaddexp(la, lb)
    with np.errstate(invalid="ignore"):
        rho = np.where(ls > NEG_INF, np.exp(la - ls), 0.0)
        rho_c = np.where(ls > NEG_INF, np.exp(lb - ls), 1.0)  # 1 - rho
    return ls, rho * q1 + rho_c * 0.5, rho * q1c + rho_c * 0.5


def _weak_nodes(
    mech: Mechanism,
    bs: IntArray,
    epsilon: float,
    tail: bool,
    rel_tol: float,
    floor: float = NEG_INF,
) -> Bounds:
    """log delta_b (upper, lower) of the A_w pair given B = b blanket messages, for each b.

    Conditionally on b, delta_b = sum_s P(S = s | b) delta_{b,s} over a window of s; the mass
    of S outside the window counts with delta <= 1. Vectorised over all b at once; a node whose
    window is too narrow for `rel_tol` is recomputed alone with a wider one, unless its upper
    bound is already below `floor` (an epsilon search's "far below target").
    """
    bs = np.asarray(bs, dtype=np.int64)
    if mech.k == 2:
        s = bs + 1
        _, q, qc = _weak_s_terms(mech, bs, s)
        return clone_pair_log_delta(s - 1, q, epsilon, tail=tail, q_c=qc)
    p2 = 2.0 / mech.k
    k_sd = 9.0
    lo, hi = sd_windows(bs, p2, k_sd)
    s_lo = np.maximum(lo, 1)
    lens = hi + 2 - s_lo
    starts = np.concatenate(([0], np.cumsum(lens)[:-1]))
    seg = np.repeat(np.arange(bs.size), lens)
    s = s_lo[seg] + (np.arange(int(lens.sum())) - starts[seg])
    b_rep = bs[seg]
    ls, q, qc = _weak_s_terms(mech, b_rep, s)
    d = clone_pair_log_delta(s - 1, q, epsilon, tail=tail, q_c=qc)
    core_up = np.logaddexp.reduceat(ls + d.upper, starts)
    core_lo = np.logaddexp.reduceat(ls + d.lower, starts)
    # P(S < lo) <= P(S' <= lo - 1);  P(S > hi + 1) <= P(S' >= hi + 1)
    t_lo = np.where(lo > 0, log_cdf(lo - 1, bs, p2), NEG_INF)
    t_hi = np.where(hi < bs, log_sf(hi + 1, bs, p2), NEG_INF)
    tail_m = np.logaddexp(t_lo, t_hi)
    up = np.logaddexp(core_up, tail_m)
    bad = (tail_m > core_up + math.log(rel_tol) - 2.0) & ~((lo == 0) & (hi == bs)) & (up >= floor)
    for i in np.flatnonzero(bad):
        up[i], core_lo[i] = _weak_node(mech, int(bs[i]), epsilon, tail, rel_tol, 2.0 * k_sd)
    return Bounds(up, core_lo)


def _weak_node(
    mech: Mechanism, b: int, epsilon: float, tail: bool, rel_tol: float, k_sd: float
) -> tuple[float, float]:
    """(log upper, log lower) of delta_b for one b, widening the window of S as needed."""
    p2 = 2.0 / mech.k
    bb = np.array([b], dtype=np.int64)
    while True:
        lo, hi = sd_window(b, p2, k_sd)  # window of S' = S - Y
        s = np.arange(max(lo, 1), hi + 2, dtype=np.int64)
        ls, q, qc = _weak_s_terms(mech, np.broadcast_to(bb, s.shape), s)
        d = clone_pair_log_delta(s - 1, q, epsilon, tail=tail, q_c=qc)
        core_up = logsumexp(ls + d.upper)
        core_lo = logsumexp(ls + d.lower)
        tails = []
        if lo > 0:
            tails.append(float(log_cdf(lo - 1, b, p2)))
        if hi < b:
            tails.append(float(log_sf(hi + 1, b, p2)))
        tail_m = logsumexp(np.asarray(tails)) if tails else NEG_INF
        full = lo == 0 and hi == b
        if full or tail_m <= core_up + math.log(rel_tol) - 2.0 or core_up == tail_m == NEG_INF:
            return float(np.logaddexp(core_up, tail_m)), core_lo
        k_sd *= 2.0


def weak_log_delta(
    mech: Mechanism,
    epsilon: float,
    *,
    form: str = "hockey",
    rel_tol: float = 5e-3,
    stop_below: float = NEG_INF,
    stop_above: float = math.inf,
) -> MixtureResult:
    """log delta(epsilon) of the A_w pair (Theorem 10 / 11), uncapped.

    The upper bound is rigorous; `rel_tol` is how close (relative, in delta) it is to the exact
    pair's delta (bucketing of B). 5e-3 moves epsilon by well under 0.1 %.
    """
    _check_form(form)
    if epsilon > mech.eps0 or (epsilon == mech.eps0 and form == "hockey"):  # |loss| <= eps0
        return MixtureResult(NEG_INF, NEG_INF, NEG_INF, (0, mech.n - 1))
    tail = form == "tail"

    def component(bs: IntArray) -> Bounds:
        return _weak_nodes(mech, bs, epsilon, tail, rel_tol, floor=stop_below - 10.0)

    if not tail:
        return bucketed_mixture_log_delta(
            mech.n - 1,
            mech.gamma,
            component,
            rel_tol=rel_tol,
            stop_below=stop_below,
            stop_above=stop_above,
        )
    # not monotone in b: every b of the window is summed (slow at n >= 1e5), tails count as 1
    return mixture_log_delta(
        mech.n - 1,
        mech.gamma,
        component,
        rel_tol=1e-4,
        monotone=False,
        stop_below=stop_below,
    )


def weak_delta(mech: Mechanism, epsilon: float, *, form: str = "hockey") -> PrivacyResult:
    """delta(epsilon) of `blanket-weak` (Koskela et al. Theorem 10), capped by LDP."""

    def log_delta() -> MixtureResult:
        return weak_log_delta(mech, epsilon, form=form)

    return _delta(mech, epsilon, log_delta, _weak_label(form), {"form": form}, "b_window")


def weak_epsilon(mech: Mechanism, delta: float, *, form: str = "hockey") -> PrivacyResult:
    """epsilon(delta) of `blanket-weak` (Koskela et al. Theorem 10), capped by LDP."""

    def log_delta(e: float, log_t: float) -> MixtureResult:
        return weak_log_delta(mech, e, form=form, stop_below=log_t - 5.0, stop_above=log_t + 2.0)

    return _epsilon(mech, delta, log_delta, _weak_label(form), {"form": form})


def weak_pld(
    mech: Mechanism,
    *,
    buckets: int | None = None,
    tau: float = 1e-15,
    grid: float | None = None,
) -> PrivacyLossDistribution:
    """A dominating PLD of the A_w pair, for composition (NOT LDP-capped).

    B is rounded DOWN to the smallest node of its bucket: the pair at b is a post-processing
    (add b - node uniform messages) of the pair at the node, with the same kernel under both
    hypotheses, so the bucketed pair dominates the exact one. B below the window and the
    truncated S / n1 tails count as infinite loss; B above the window uses the top node.
    Losses are rounded up to `grid` (default 1e-5) and merged. The number of nodes follows an
    atom budget (every b when affordable, at least 48); the bucketing makes delta a few percent
    pessimistic at most at n ~ 1e3..1e4, more in far tails at n >= 1e5. Cost: seconds at
    n <= 1e4, 20-40 s at n = 1e5 (tens of millions of atoms are generated and merged).
    """
    check_query(mech)
    n, gamma, k = mech.n, mech.gamma, mech.k
    k_sd = max(6.0, math.sqrt(2.0 * math.log(2.0 / tau)) + 1.0)
    lo, hi = sd_window(n - 1, gamma, k_sd)
    width = hi - lo + 1
    if buckets is None:  # as many nodes as an atom budget allows (atoms per node ~ s x n1)
        mean_b = (n - 1) * gamma
        sd_s = math.sqrt(max(mean_b * (2.0 / k) * (1.0 - 2.0 / k), 1.0))
        per_node = (2.0 * k_sd * sd_s + 3.0) * (k_sd * math.sqrt(mean_b * 2.0 / k + 1.0) + 5.0)
        buckets = int(min(width, max(48, 8e6 / per_node)))
    if width <= buckets:  # every b is its own node (no bucketing loss)
        nodes = np.arange(lo, hi + 1, dtype=np.int64)
    else:  # half uniform over the window, half at binomial quantiles (dense where mass is)
        mean_b = (n - 1) * gamma
        sd_b = math.sqrt((n - 1) * gamma * (1.0 - gamma))
        u = (np.arange(buckets // 2) + 0.5) / (buckets // 2)
        quant = mean_b + sd_b * special.ndtri(u)
        pts = np.concatenate((np.linspace(lo, hi, buckets - buckets // 2), quant, [lo]))
        nodes = np.unique(np.clip(np.round(pts), lo, hi).astype(np.int64))
    bs = np.arange(lo, hi + 1, dtype=np.int64)
    lw = log_pmf(bs, n - 1, gamma)
    mass = np.logaddexp.reduceat(lw, nodes - lo)
    if hi < n - 1:  # above the window: dominated by the top node
        mass[-1] = np.logaddexp(mass[-1], float(log_sf(hi + 1, n - 1, gamma)))
    if grid is None:
        grid = 1e-5
    acc = LossBinner(grid)
    if lo > 0:
        acc.add_inf(float(log_cdf(lo - 1, n - 1, gamma)))
    for b, lm in zip(nodes.tolist(), mass.tolist(), strict=True):
        b = int(b)
        if k == 2:
            s = np.array([b + 1], dtype=np.int64)
        else:
            slo, shi = sd_window(b, 2.0 / k, k_sd)
            s = np.arange(slo, shi + 2, dtype=np.int64)
            tails = []
            if slo > 0:
                tails.append(float(log_cdf(slo - 1, b, 2.0 / k)))
            if shi < b:
                tails.append(float(log_sf(shi + 1, b, 2.0 / k)))
            acc.add_inf(lm + logsumexp(np.asarray(tails)) if tails else NEG_INF)
        ls, q, qc = _weak_s_terms(mech, np.full(s.shape, b), s)
        zero = s == 0  # no message in bins x0, x1: loss 0
        if np.any(zero):
            acc.add(np.zeros(int(zero.sum())), lm + ls[zero])
        pos = ~zero
        add_clone_mixture_atoms(acc, s[pos] - 1, lm + ls[pos], q[pos], q_c=qc[pos], k_sd=k_sd)
    return acc.build(
        f"Koskela et al. Thm 10 pair (A_w, joint law), n={n}, k={k}, eps0={mech.eps0:g}; "
        f"B rounded down to {len(nodes)} bucket nodes (dominating); losses rounded up to a "
        f"{grid:g} grid; truncated mass counted as infinite loss"
    )


def _weak_label(form: str) -> Label:
    _check_form(form)
    what = _FORM_TEXT[form]
    return Label(
        WEAK, f"Koskela et al. Thm 10 pair (others' blanket bits known), {what}; joint law"
    )


# ----------------------------------------------------------------------------- shared


def _delta(
    mech: Mechanism,
    epsilon: float,
    log_delta: Callable[[], MixtureResult],
    label: Label,
    details: dict[str, object],
    window: str,
) -> PrivacyResult:
    """A pair's delta at `epsilon`, with its lower estimate and truncation in `details`."""
    t0 = time.perf_counter()
    check_query(mech, epsilon)
    mr = log_delta()
    details |= {
        "lower_log_delta_of_pair": mr.lower,
        "log_truncated_tail_bound": mr.log_tail_mass,
        window: mr.window,
    }
    return delta_result(mech, epsilon, mr.upper, label, t0, details)


def _epsilon(
    mech: Mechanism,
    delta: float,
    log_delta: Callable[[float, float], MixtureResult],
    label: Label,
    details: dict[str, object],
) -> PrivacyResult:
    """A pair's epsilon at `delta`; `log_delta(eps, log target)` may stop early far from it."""
    t0 = time.perf_counter()
    check_query(mech, delta=delta)
    log_t = math.log(delta) if delta > 0 else NEG_INF

    def curve(e: float) -> float:
        return log_delta(e, log_t).upper

    return solved_epsilon_result(mech, delta, curve, label, t0, details)
