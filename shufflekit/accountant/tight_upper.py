"""`tight`'s upper bound on one round: the privacy blanket with the other users' blanket bits
revealed, evaluated exactly with B bucketed (sound), and its PLD for composition over rounds.

The privacy blanket with the other users' blanket
bits revealed (adversary A_w of Koskela et al., Thm 10; Balle et al. 2019). k-RR(eps0) equals
"with probability 1 - gamma report the true value, with probability gamma = kq report a uniform
value". Give the adversary, on top of the histogram, which of the other users took the uniform
branch. Its view then determines our adversary's view (our histogram is a function of its view:
it *is* the same histogram, with extra information beside it), so by the post-processing
inequality H(P_x0 || P_x1) of our view is at most that of its view, for every dataset and both
orders. In its view the non-blanket reports of the others are known and can be subtracted; what
remains is B ~ Bin(n-1, gamma) (known to it) uniform messages plus the target's report. Only the
counts (c0, c1) of x0 and x1 among these b+1 messages matter, with
    P_x0(c | b) = Mult_{b+1}(c; 1/k) * (alpha_b c0 + gamma),  alpha_b = (1-gamma) k/(b+1),
and P_x1 the same with c1. So H = sum_b P(B=b) E[(alpha_b c0 + gamma - e^eps (alpha_b c1 +
gamma))^+], the expectation over the JOINT multinomial (c0, c1). Conditioning on T = c0 + c1 ~
Bin(b+1, 2/k) and c0 | T ~ Bin(T, 1/2) turns each term into a closed-form binomial partial
expectation E[(c0 - t)^+] (`numerics.binomial.log_pos_part`), evaluated in log space.
  * H_b is non-increasing in b (b+1 blanket messages are b messages plus an independent uniform
    one: a post-processing), so B is cut into buckets, each evaluated at its smallest b (sound);
    B above the window joins the last bucket (sound for the same reason).
  * Truncation is rigorous: P(B below the window) and, per bucket, the P_x0-mass of T outside its
    window (bounded by the exact binomial tails of Bin(b, 2/k)) are ADDED to delta. Tails come
    from log-space tail functions, never from 1 - sum(kept).
  * Floating point: every log delta of the upper bound is increased by a relative safety margin
    of 1e-7 (the evaluation is accurate to ~1e-9 relative); the lower bound is decreased by it.
  * Every bound is capped by the LDP bound (eps0, 0): delta(eps) = 0 for eps >= eps0.

The PLD (`tight_pld`) is for composition over rounds by a separate engine; see its docstring for
the discretisation (losses rounded UP, monotone in the composed delta and hence sound).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from shufflekit.accountant.core import Mechanism, PrivacyLossDistribution, check_query
from shufflekit.accountant.numerics.binomial import (
    log_cdf,
    log_interval,
    log_pmf,
    log_pos_part_sf,
    log_sf,
    tail_window,
)
from shufflekit.accountant.numerics.grid import LossBinner, default_loss_step
from shufflekit.accountant.numerics.logspace import LOG_FLOAT_FLOOR, logsumexp
from shufflekit.base.arrays import BoolArray, FloatArray, IntArray
from shufflekit.base.errors import AccuracyError, InvalidParameters, NotApplicable

SAFETY = 1e-7
"""Relative floating-point safety margin on delta: added to every log delta of an upper bound
of `tight` and subtracted from every one of its lower bounds (evaluations are accurate to ~1e-9
relative)."""


@dataclass(frozen=True)
class BlanketGrid:
    """Truncated, bucketed support of the blanket (A_w) pair; independent of epsilon."""

    b_rep: FloatArray  # per element: smallest b of its bucket
    t: FloatArray  # per element: T = c0 + c1
    log_weight: FloatArray  # per element: log P(B in bucket) + log Bin(b_rep+1, 2/k)(T)
    log_dropped: float  # log of the P_x0-mass bound of everything left out
    n_buckets: int


N_MAX = 10**9
"""Largest n `tight` answers (within ~10 s); above it the method refuses (NotApplicable)."""


def check_supported(mech: Mechanism) -> None:
    """NotApplicable unless `tight` supports this round: n <= N_MAX (eps0 and k: every value a
    Mechanism accepts)."""
    if mech.n > N_MAX:
        raise NotApplicable(
            f"tight supports n <= {N_MAX:.0e} users per round, got n = {mech.n}; "
            "use a smaller batch or --method ldp"
        )


def blanket_grid(
    mech: Mechanism, log_tau: float, log_delta_hint: float, bucket_scale: float = 1.0
) -> BlanketGrid:
    """The blanket pair's support on buckets of b; `bucket_scale` > 1 widens the buckets
    (faster, looser: used to locate a root before the final, fine evaluations)."""
    check_supported(mech)
    n, k = mech.n, mech.k
    g = mech.gamma
    n1 = n - 1
    pt = 2.0 / k
    if n1 == 0:
        edges = np.array([0.0])
        log_w = np.array([0.0])
        log_drop_b = -math.inf
    else:
        blo_a, bhi_a = tail_window(n1, g, log_tau)
        blo, bhi = float(blo_a[0]), float(bhi_a[0])
        log_drop_b = float(log_cdf(blo - 1, n1, g, "upper")) if blo > 0 else -math.inf
        mean = n1 * g
        sd = math.sqrt(max(n1 * g * (1 - g), 1e-300))
        # bucket width w: relative delta error of a bucket ~ w |log delta| / (2 b) <= 2.5e-3,
        # i.e. <= ~1e-4 relative in epsilon (measured: +0.006..0.01% at n = 1e4..1e7; at 4x
        # wider buckets +0.04%, which left `tight` above the unbucketed `blanket-weak`)
        # H_b falls with b, so only buckets above the bulk may be wider (little mass, small H_b)
        # (in deep tails a 1e-3 relative error of log delta is enough: w >= 2e-3 b)
        rel = bucket_scale * 5e-3 / max(1.0, -log_delta_hint)
        if -log_delta_hint > 100:
            rel = max(rel, 2e-3)
        e_list = [blo]
        x = blo
        while x <= bhi:
            if len(e_list) > _MAX_BUCKETS:
                raise TooBigError
            z = (x - mean) / sd
            w = max(1.0, math.floor(rel * x)) * (1 if z <= 2.5 else (4 if z <= 4 else 16))
            x = x + w
            if x <= bhi:
                e_list.append(x)
        edges = np.array(e_list)
        ends = np.append(edges[1:] - 1, n1)  # last bucket takes everything above
        log_w = log_interval(edges, ends, n1, g)
    # T-window per bucket
    tlo, thi = tail_window(edges, pt, log_tau)
    drop_t = np.logaddexp(
        np.where(tlo > 0, log_cdf(tlo - 1, edges, pt, "upper"), -np.inf),
        log_sf(thi + 1, edges, pt, "upper"),
    )
    log_dropped = logsumexp(np.append(log_w + drop_t, log_drop_b))
    counts = (thi + 1 - tlo + 1).astype(np.int64)
    if int(counts.sum()) > _MAX_ELEMENTS:
        raise TooBigError
    idx = np.repeat(np.arange(edges.size), counts)
    offs = np.arange(idx.size) - np.repeat(np.cumsum(counts) - counts, counts)
    t = tlo[idx] + offs
    b_rep = edges[idx]
    log_weight = log_w[idx] + log_pmf(t, b_rep + 1, pt)
    keep = np.isfinite(log_weight)
    return BlanketGrid(b_rep[keep], t[keep], log_weight[keep], log_dropped, int(edges.size))


LOCATE_ELEMENTS = 12_000
"""Elements of the grid that only locates a root (`thinned`): an evaluation costs about as
many incomplete beta functions."""


def thinned(grid: BlanketGrid, max_elements: int = LOCATE_ELEMENTS) -> BlanketGrid:
    """An approximation of `grid` with at most ~max_elements elements, for LOCATING a root
    only (never a bound): within each bucket, runs of m consecutive T are represented by
    their middle T carrying the run's total weight. The blanket terms are smooth in T on the
    scale of its standard deviation, so the value moves by far less than the root tolerance
    while each bucket keeps >= 64 points; `grid` itself when no thinning is needed."""
    size = grid.t.size
    starts = np.flatnonzero(np.r_[True, grid.b_rep[1:] != grid.b_rep[:-1]])
    counts = np.diff(np.r_[starts, size])
    m = min(size // max(max_elements, 1), int(counts.min()) // 64)
    if m < 2:
        return grid
    pos = np.arange(size) - np.repeat(starts, counts)
    heads = np.flatnonzero(pos % m == 0)
    ends = np.r_[heads[1:], size]  # runs never cross a bucket: each bucket starts a run
    mid = (heads + ends - 1) // 2  # the run's middle T (a midpoint rule)
    log_w = np.logaddexp.reduceat(grid.log_weight, heads)
    return BlanketGrid(grid.b_rep[mid], grid.t[mid], log_w, grid.log_dropped, grid.n_buckets)


def blanket_eval(mech: Mechanism, grid: BlanketGrid, eps: float) -> tuple[float, float]:
    """(log hockey-stick body, log P_x0(L > eps) body) of the blanket pair on the grid.

    The second value gives the derivative: d delta / d eps = -(P(L > eps) - delta).
    Each term is E[(c0 - tau)^+], c0 ~ Bin(T, 1/2), tau = (e^eps T + lam)/(1 + e^eps) with
    lam = (b+1)(e^eps - 1)/(e^eps0 - 1) (`_thresholds`: tau rounded DOWN, so each term is
    rounded up, and the top count T - tau computed without cancellation near eps0).
    """
    rr = mech.krr
    g, k = rr.gamma, mech.k
    e = math.exp(eps)
    b1 = grid.b_rep + 1.0
    alpha = rr.one_minus_gamma * k / b1
    tau, top_gap = _thresholds(mech, b1, grid.t, eps)
    top = (top_gap > 0.0) & (top_gap <= 1.0)
    lg = np.full(tau.shape, -np.inf)
    lsf = np.full(tau.shape, -np.inf)
    rest = top_gap > 1.0
    lg[rest], lsf[rest] = log_pos_part_sf(tau[rest], grid.t[rest], 0.5, "upper")
    # only c0 = T lies above tau: E[(c0 - tau)^+] = (T - tau) 2^-T, P(c0 > tau) = 2^-T
    lsf[top] = -grid.t[top] * math.log(2.0)
    lg[top] = np.log(top_gap[top]) + lsf[top]
    la = grid.log_weight + np.log(alpha)
    body = logsumexp(la + math.log(1.0 + e) + lg)
    # P_x0(L > eps | b, T) = alpha E[(c0 + beta) 1{c0 > tau}] = alpha (G + (tau + beta) sf)
    beta = g / alpha
    with np.errstate(divide="ignore", invalid="ignore"):
        ptail = logsumexp(la + np.logaddexp(lg, np.log(tau + beta) + lsf))
    return body, ptail


_U = 2.0**-53
_TAU_REL = 32 * _U  # bound on the relative rounding error of a computed tau (all terms > 0)


def _thresholds(
    mech: Mechanism, b1: FloatArray, t: FloatArray, eps: float
) -> tuple[FloatArray, FloatArray]:
    """(tau rounded down, T - tau rounded up) of the blanket terms (see `blanket_eval`).

    tau is a sum and quotient of positive terms, so its computed value is within _TAU_REL
    relative of the exact one: lowering it by that much can only raise E[(c0 - tau)^+] (a
    decreasing function of tau), which keeps the bound sound. Near eps0, tau is within 1e-19
    of T = b + 1 and that rounding would swamp T - tau; there T - tau = (b+1) e^eps
    (e^(eps0 - eps) - 1) / ((e^eps0 - 1)(1 + e^eps)), from eps0 - eps without cancellation.
    """
    eps0 = mech.eps0
    e = math.exp(eps)
    em0 = math.expm1(eps0)
    r = math.expm1(eps) / em0  # lam = b1 r, r in [0, 1)
    lam = b1 * r
    tau = (e * t + lam) / (1.0 + e)
    tau_down = tau * (1.0 - _TAU_REL)
    # 1 - r = e^eps (e^(eps0 - eps) - 1) / (e^eps0 - 1), exact ingredients
    one_minus_r = math.expm1(eps0 - eps) / (em0 * math.exp(-eps)) if eps < eps0 else 0.0
    gap_full = b1 * one_minus_r / (1.0 + e)  # T - tau at T = b + 1
    gap_generic = (t - lam) / (1.0 + e)
    at_full = t == b1
    gap = np.where(at_full, gap_full * (1.0 + _TAU_REL), gap_generic)
    # elsewhere the generic T - tau has absolute error <= _TAU_REL tau: round it up as well
    gap = np.where(at_full, gap, gap + _TAU_REL * tau)
    return tau_down, gap


_CHUNK = 1 << 16  # atoms per block of the PLD kernel (its temporaries stay in the CPU cache)


def blanket_atoms(
    sup: BlanketSupport, tiny: list[float]
) -> Iterator[tuple[FloatArray, FloatArray, BoolArray, FloatArray, BoolArray]]:
    """The blanket pair's atoms a block of rows at a time, from each row's upper half c0 >=
    T/2 only: (loss x, log P-mass of c0, where valid, log P-mass of the mirror T - c0 whose
    loss is -x, where a mirror is distinct). Masses with log below LOG_FLOAT_FLOOR are left
    out of the masks; the log of their sum is appended to `tiny` (the caller counts it as
    +inf loss).

    Atom (b, T, c0) has loss log(c0 + beta) - log(T - c0 + beta) and P-mass w(b, T)
    Bin(T, 1/2)(c0) alpha (c0 + beta). The c0-window [clo, chi] is symmetric about T/2
    (`tail_window` at p = 1/2), and c0 <-> T - c0 negates the loss and keeps the binomial term,
    so each row is computed from c0 >= T/2 only. log(c + beta) comes from a per-bucket table,
    the binomial from its ratio recurrence started at the centre (`log_pmf` there).
    """
    grid, clo, chi, beta = sup.grid, sup.clo, sup.chi, sup.beta
    t = grid.t
    if not np.array_equal(clo, t - chi):
        raise AccuracyError("tight_pld: the c0-window is not symmetric about T/2")
    cm = np.ceil(t / 2.0)
    width = (chi - cm + 1).astype(np.int64)
    tmax = int(t.max())
    _, first, bucket = np.unique(grid.b_rep, return_index=True, return_inverse=True)
    cs = np.arange(tmax + 1, dtype=np.float64)
    log_cb = np.log(cs[None, :] + beta[first][:, None]).ravel()  # log(c + beta) per bucket
    with np.errstate(divide="ignore"):
        log_int = np.log(np.arange(tmax + 2, dtype=np.float64))  # log m, m = 0 .. tmax + 1
    lstart = log_pmf(cm, t, 0.5) + grid.log_weight + np.log(sup.alpha)
    order = np.argsort(width, kind="stable")
    s0 = 0
    while s0 < t.size:
        rows = order[s0 : s0 + max(1, _CHUNK // int(width[order[s0]]))]
        s0 += rows.size
        ti = t[rows].astype(np.int64)[:, None]
        c_mid = cm[rows].astype(np.int64)[:, None]
        c = c_mid + np.arange(int(width[rows[-1]]))[None, :]
        valid = c <= chi[rows].astype(np.int64)[:, None]
        c = np.where(valid, c, c_mid)  # padding: the centre (a finite loss in range)
        off = (bucket[rows] * (tmax + 1))[:, None]
        lcb = log_cb[off + c]
        lcb_m = log_cb[off + ti - c]
        ratio = log_int[np.maximum(ti - c, 1)] - log_int[c + 1]  # log pmf(c+1)/pmf(c)
        lbin = np.empty(c.shape)
        lbin[:, 0] = 0.0
        np.cumsum(ratio[:, :-1], axis=1, out=lbin[:, 1:])
        lbin += lstart[rows][:, None]
        masks = []
        for lm, keep in ((lbin + lcb, valid), (lbin + lcb_m, valid & (2 * c > ti))):
            small = lm < LOG_FLOAT_FLOOR
            if np.any(small & keep):
                tiny.append(logsumexp(lm[small & keep]))
                keep = keep & ~small
            masks.append((lm, keep))
        (lm_up, keep_up), (lm_mirror, keep_mirror) = masks
        yield lcb - lcb_m, lm_up, keep_up, lm_mirror, keep_mirror


def _blanket_atoms(
    sup: BlanketSupport, step: float, tol: float
) -> tuple[IntArray, FloatArray, float]:
    """The blanket pair's atoms summed by loss grid index (rounded up): (indices, P-masses,
    log of the mass too small for a float, which the caller counts as infinite loss). The
    mirror's index -floor(x + tol) is the same float as ceil(-x - tol), its own loss rounded
    up."""
    acc = _DenseSum()
    tiny = [-math.inf]
    for loss, lm_up, keep_up, lm_mirror, keep_mirror in blanket_atoms(sup, tiny):
        x = loss / step
        acc.add(np.ceil(x - tol).astype(np.int64), np.exp(lm_up) * keep_up)
        acc.add((-np.floor(x + tol)).astype(np.int64), np.exp(lm_mirror) * keep_mirror)
    idx, mass = acc.nonzero()
    return idx, mass, logsumexp(np.array(tiny))


class _DenseSum:
    """Masses summed by integer index on a dense array that grows as indices arrive."""

    def __init__(self) -> None:
        self.lo = 0
        self.w = np.zeros(0)

    def add(self, idx: IntArray, mass: FloatArray) -> None:
        """Add `mass[i]` at index `idx[i]` (same shapes)."""
        lo = min(int(idx.min()), self.lo if self.w.size else int(idx.min()))
        hi = max(int(idx.max()) + 1, self.lo + self.w.size)
        if lo < self.lo or hi > self.lo + self.w.size:
            grown = np.zeros(hi - lo)
            grown[self.lo - lo : self.lo - lo + self.w.size] = self.w
            self.lo, self.w = lo, grown
        self.w += np.bincount((idx - self.lo).ravel(), weights=mass.ravel(), minlength=self.w.size)

    def nonzero(self) -> tuple[IntArray, FloatArray]:
        """(indices with mass > 0, their masses), indices ascending."""
        nz = np.flatnonzero(self.w > 0)
        return (nz + self.lo).astype(np.int64), self.w[nz]


class TooBigError(Exception):
    """A truncation window would need more elements than the evaluation budget."""


_MAX_BUCKETS = 20_000
_MAX_ELEMENTS = 3_000_000


def upper_bound(
    mech: Mechanism, eps: float, log_delta_hint: float | None = None
) -> tuple[float, float, int, bool]:
    """(log delta upper bound incl. dropped mass and margin, log dropped, #buckets, limited).

    `limited` is True when the truncated mass could not be made negligible within the
    evaluation budget (deep tails, delta far below 1e-300): the value is then still a sound
    upper bound (kept part + dropped mass) but may be loose.
    """
    if eps >= mech.eps0:
        return -math.inf, -math.inf, 0, False
    hint = -14.0 if log_delta_hint is None else log_delta_hint
    log_tau = min(-30.0, hint - 16.0)
    best: tuple[float, float, int] | None = None
    fitted: float | None = None  # the deepest truncation whose grid fitted
    for _ in range(8):
        try:
            grid = blanket_grid(mech, log_tau, hint)
        except TooBigError:
            # too deep for the budget: back off halfway to the last that fitted (it gave
            # up here: n=99774, k=3, eps0=1.12, eps=0.5 answered e^-32 where e^-4005 fits)
            if fitted is None or log_tau >= fitted - 8.0:
                break
            log_tau = 0.5 * (log_tau + fitted)
            continue
        fitted = log_tau
        body = blanket_eval(mech, grid, eps)[0]
        total = float(np.logaddexp(body, grid.log_dropped))
        if best is None or total < best[0]:
            best = (total, grid.log_dropped, grid.n_buckets)
        if grid.log_dropped <= total - 13.0 or total == -math.inf:
            return total + SAFETY, grid.log_dropped, grid.n_buckets, False
        # the kept part is a (truncated) lower estimate of delta: aim the truncation below it
        hint = body if body > -math.inf else total
        log_tau = min(log_tau - 64.0, hint - 16.0)
    if best is None:
        raise AccuracyError(
            f"tight: cannot evaluate the blanket bound at n={mech.n}, k={mech.k}, "
            f"eps0={mech.eps0}, eps={eps} within the evaluation budget"
        )
    return best[0] + SAFETY, best[1], best[2], True


def upper_log_delta(mech: Mechanism, epsilon: float) -> float:
    """Natural log of the sound upper bound on the tight delta(epsilon) (-inf when 0)."""
    check_query(mech, epsilon)
    return upper_bound(mech, float(epsilon))[0]


@dataclass(frozen=True)
class BlanketSupport:
    """The blanket pair's rows as `tight_pld` sums them: buckets of B (`blanket_grid`, at
    bucket_scale 4), per (bucket, T) the window [clo, chi] of c0 ~ Bin(T, 1/2), beta and alpha
    of the row's bucket, and the log of the P-mass left out (B, T and c0 outside windows)."""

    grid: BlanketGrid
    clo: FloatArray
    chi: FloatArray
    beta: FloatArray
    alpha: FloatArray
    log_inf: float


def blanket_support(mech: Mechanism, log_tau: float, log_delta_hint: float) -> BlanketSupport:
    """The rows of the blanket pair's PLD, truncated at level e^log_tau per window."""
    if not (log_tau < -5):
        raise InvalidParameters("log_tau must be < -5")
    g = mech.gamma
    k = mech.k
    # buckets as wide as before the single-round refinement: the PLD grid step dominates here
    grid = blanket_grid(mech, log_tau, log_delta_hint, bucket_scale=4.0)
    b1 = grid.b_rep + 1.0
    beta = g * b1 / ((1.0 - g) * k)
    alpha = (1.0 - g) * k / b1
    # per (bucket, T): window of c0 ~ Bin(T, 1/2)
    t = grid.t
    clo, chi = tail_window(t, 0.5, log_tau)
    # P_x0(c0 > chi | T) <= P(Bin(T-1, 1/2) >= chi), P_x0(c0 < clo | T) <= P(Bin(T, 1/2) < clo)
    drop_c = np.logaddexp(
        np.where(clo > 0, log_cdf(clo - 1, t, 0.5), -np.inf),
        np.where(t >= 1, log_sf(chi, np.maximum(t - 1, 0), 0.5), -np.inf),
    )
    log_inf = float(np.logaddexp(grid.log_dropped, logsumexp(grid.log_weight + drop_c)))
    return BlanketSupport(grid, clo, chi, beta, alpha, log_inf)


def tight_pld(
    mech: Mechanism,
    *,
    loss_step: float | None = None,
    n_atoms: int = 20000,
    log_tau: float = -32.0,
    log_delta_hint: float = -14.0,
) -> PrivacyLossDistribution:
    """PLD of the dominating pair behind `tight`'s upper bound (blanket, others' bits revealed).

    Law of log(P_x0/P_x1)(view) under P_x0, for the view (B, c0, c1): a mixture over B of the
    exact per-B pairs, with B bucketed and each bucket represented by its smallest B (a
    dominating pair, so composing it is sound). The pair is symmetric (swapping x0 and x1 swaps
    P and Q), so the x1|x0 direction has the same PLD: no direction parameter is needed.

    Discretisation: losses are rounded UP to the grid `loss_step` (default: the loss span of the
    kept support / `n_atoms`); rounding up only increases every composed delta (delta of a
    composition is monotone in each round's losses under the same P-law), so the PLD stays an
    upper bound. Truncated mass (B below its window, T and c0 outside theirs, each bounded by
    binomial tails, at level e^log_tau per window) is put in `log_inf_mass`, never renormalised.
    """
    check_query(mech)
    sup = blanket_support(mech, log_tau, log_delta_hint)
    grid, chi, beta = sup.grid, sup.chi, sup.beta
    t = grid.t
    k = mech.k
    span = 2.0 * float(
        np.max(np.log((chi + beta) / np.maximum(t - chi + beta, 1e-300)), initial=mech.eps0 * 1e-3)
    )
    span = min(span, 2.0 * mech.eps0)
    step = loss_step if loss_step is not None else default_loss_step(span, n_atoms)
    if not (step > 0 and math.isfinite(step)):
        raise InvalidParameters(f"loss_step must be > 0, got {loss_step!r}")
    binner = LossBinner(step, up=True)
    idx, mass, log_tiny = _blanket_atoms(sup, step, binner.tolerance)
    binner.add_indexed(idx, mass)
    binner.add_inf(sup.log_inf)
    binner.add_inf(log_tiny)
    return binner.build(
        f"tight upper: blanket pair (others' blanket bits revealed), n={mech.n}, k={k}, "
        f"eps0={mech.eps0}, {grid.n_buckets} B-buckets at their smallest B, losses rounded "
        f"up to step {step:.3g}, truncated mass in inf"
    )
