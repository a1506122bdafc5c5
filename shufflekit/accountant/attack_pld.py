"""PLDs of explicit worst-case datasets (the attacks of `accountant.attack`): composing one
dataset's PLD over rounds gives a LOWER bound on the composed privacy loss.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TypedDict, Unpack

import numpy as np

from shufflekit.accountant.core import Mechanism, PrivacyLossDistribution, check_query
from shufflekit.accountant.numerics.binomial import log_interval, log_pmf, tail_window
from shufflekit.accountant.numerics.grid import LossBinner, default_loss_step
from shufflekit.accountant.numerics.logspace import logsumexp_rows
from shufflekit.base.arrays import FloatArray
from shufflekit.base.errors import InvalidParameters

AtomChunks = Iterator[tuple[FloatArray, FloatArray]]
"""A pair's atoms, chunk by chunk: (losses, their log masses under the first law)."""
AtomLists = tuple[list[FloatArray], list[FloatArray]]
"""A pair's atoms as two lists of chunks: losses, log masses."""


def _pld_all_at_x0(mech: Mechanism, reverse: bool, log_tau: float) -> AtomLists:
    """Atoms (loss, log mass under the first law) of "all others at x0"; reverse: x1|x0."""
    return _collect(_iter_all_at_x0(mech, reverse, log_tau))


def _collect(chunks: AtomChunks) -> AtomLists:
    """The chunks of atoms as two lists (losses, log masses)."""
    ls: list[FloatArray] = []
    ms: list[FloatArray] = []
    for loss, lm in chunks:
        ls.append(loss)
        ms.append(lm)
    return ls, ms


def _iter_all_at_x0(mech: Mechanism, reverse: bool, log_tau: float) -> AtomChunks:
    """`_pld_all_at_x0`'s atoms, chunk by chunk (memory stays small at large n)."""
    n, k, eps0 = mech.n, mech.k, mech.eps0
    rr = mech.krr
    q, g = rr.q, rr.gamma
    r = math.exp(-eps0)
    pc = rr.one_minus_p  # h0 ~ Bin(n, p) is read as n - h0 (p rounds towards 1)
    mlo, mhi = tail_window(n, pc, log_tau)
    h0_all = np.arange(n - mhi[0], n - mlo[0] + 1)
    lnq = math.log(n * q)
    for s0 in range(0, h0_all.size, 512):
        h0 = h0_all[s0 : s0 + 512]
        big_n = n - h0
        lp0 = log_pmf(big_n, n, pc)
        blanket = (g / k) * (h0 * r + n - h0)
        if k == 2:
            h1 = big_n[:, None].astype(np.float64)
            lp1 = np.zeros_like(h1)
        else:
            a1, b1 = tail_window(big_n, 1.0 / (k - 1), log_tau)
            w = int((b1 - a1).max()) + 1
            h1 = a1[:, None] + np.arange(w)[None, :]
            lp1 = np.where(h1 <= b1[:, None], log_pmf(h1, big_n[:, None], 1.0 / (k - 1)), -np.inf)
        a0v = ((1.0 - g) * h0 * r + blanket)[:, None]
        a1v = (1.0 - g) * h1 + blanket[:, None]
        with np.errstate(divide="ignore", invalid="ignore"):
            if not reverse:
                loss = np.log(a0v) - np.log(a1v)
                lm = lp0[:, None] + lp1 + np.log(a0v) - lnq
            else:
                loss = np.log(a1v) - np.log(a0v)
                lm = lp0[:, None] + lp1 + np.log(a1v) - lnq
        ok = np.isfinite(lm) & np.isfinite(loss)
        yield loss[ok], lm[ok]


def _pld_all_at_z(mech: Mechanism, log_tau: float, z_bins: int) -> AtomLists:
    """Atoms of "all others at z" (k >= 3); for k >= 4 the adversary sees h_z in z_bins bins
    per T (a post-processing of the histogram, so still a lower bound)."""
    return _collect(iter_all_at_z(mech, log_tau, z_bins))


def z_view(
    mech: Mechanism, log_tau: float, z_bins: int
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """What the adversary of "all others at z" sees besides h_x0: the totals T = h_x0 + h_x1
    in their window, and per T and h_z bin the bin's log weight and blanket term V (the law of
    h_x0 given T and the bin is then Bin(T, 1/2) tilted by (1 - gamma) h_x0 + V)."""
    n, k, eps0 = mech.n, mech.k, mech.eps0
    rr = mech.krr
    p, q, g = rr.p, rr.q, rr.gamma
    kappa = 1.0 - math.exp(-eps0)
    tlo, thi = tail_window(n, 2 * q, log_tau)
    t_all = np.arange(tlo[0], thi[0] + 1)
    if k == 3:
        return t_all, np.zeros((t_all.size, 1)), ((g / k) * (n - kappa * (n - t_all)))[:, None]
    pz = p / (1.0 - 2 * q)
    big_n = n - t_all
    zlo, zhi = tail_window(big_n, pz, log_tau)
    edges = zlo[:, None] + (zhi - zlo + 1)[:, None] * np.arange(z_bins + 1)[None, :] / z_bins
    edges = np.floor(edges)
    a = edges[:, :-1]
    b = edges[:, 1:] - 1
    b[:, -1] = zhi
    nn = np.broadcast_to(big_n[:, None], a.shape)
    lm0 = log_interval(a, b, nn, pz)
    # E[h_z 1{a <= h_z <= b}] = N pz P(a-1 <= Bin(N-1, pz) <= b-1)
    lm1 = np.log(np.maximum(nn * pz, 1e-300)) + log_interval(
        a - 1, b - 1, np.maximum(nn - 1, 0), pz
    )
    with np.errstate(invalid="ignore", over="ignore"):
        mean_z = np.where(np.isfinite(lm0), np.exp(lm1 - lm0), 0.0)
    return t_all, lm0, (g / k) * (n - kappa * mean_z)


def iter_all_at_z(mech: Mechanism, log_tau: float, z_bins: int) -> AtomChunks:
    """`_pld_all_at_z`'s atoms, chunk by chunk."""
    n, q, g = mech.n, mech.krr.q, mech.krr.gamma
    lnq = math.log(n * q)
    t_all, bin_lw, bin_v = z_view(mech, log_tau, z_bins)
    for i0 in range(0, t_all.size, 64):
        tt = t_all[i0 : i0 + 64]
        clo, chi = tail_window(tt, 0.5, log_tau)
        w = int((chi - clo).max()) + 1
        h0 = clo[:, None] + np.arange(w)[None, :]
        valid = h0 <= chi[:, None]
        lp = (
            np.where(valid, log_pmf(h0, tt[:, None], 0.5), -np.inf) + log_pmf(tt, n, 2 * q)[:, None]
        )
        for j in range(bin_lw.shape[1]):
            v = bin_v[i0 : i0 + 64, j][:, None]
            lw = bin_lw[i0 : i0 + 64, j][:, None]
            a0 = (1.0 - g) * h0 + v
            a1 = (1.0 - g) * (tt[:, None] - h0) + v
            with np.errstate(divide="ignore", invalid="ignore"):
                loss = np.log(a0) - np.log(a1)
                lm = lp + lw + np.log(a0) - lnq
            ok = valid & np.isfinite(lm)
            yield loss[ok], lm[ok]


def _pld_k2_m(mech: Mechanism, m: int, reverse: bool, log_tau: float) -> AtomLists:
    """Atoms of k = 2, "m others at x0, the rest at x1" (the output is the count of x0)."""
    n = mech.n
    rr = mech.krr
    p, q = rr.p, rr.q
    m2 = n - 1 - m
    if m > 0:  # A ~ Bin(m, p) read as m - A ~ Bin(m, q): p rounds towards 1 as eps0 grows
        alo, ahi = tail_window(m, q, log_tau)
        ar = np.arange(m - ahi[0], m - alo[0] + 1)
    else:
        ar = np.array([0.0])
    la = log_pmf(m - ar, m, q)
    mu = m * p + m2 * q
    sd = math.sqrt(max((n - 1) * p * q, 1e-12))
    width = math.sqrt(-2 * log_tau) + 5
    s = np.arange(max(0, int(mu - width * sd) - 2), min(n, int(mu + width * sd) + 3) + 1)
    lc = np.full(s.size + 1, -np.inf)  # log C(s-1) for index 0, log C(s) after
    sc = np.concatenate([[s[0] - 1], s]).astype(np.float64)
    for i0 in range(0, sc.size, 256):
        blk = sc[i0 : i0 + 256]
        lc[i0 : i0 + 256] = logsumexp_rows(la[None, :] + log_pmf(blk[:, None] - ar[None, :], m2, q))
    lcm1, lc0 = lc[:-1], lc[1:]
    lp0 = np.logaddexp(math.log(p) + lcm1, math.log(q) + lc0)
    lp1 = np.logaddexp(math.log(q) + lcm1, math.log(p) + lc0)
    if reverse:
        lp0, lp1 = lp1, lp0
    ok = np.isfinite(lp0) & np.isfinite(lp1)
    return [lp0[ok] - lp1[ok]], [lp0[ok]]


N_ATOMS = 20000  # default: the loss span is cut into this many grid steps
LOG_TAU = -36.0  # default: binomial windows keep all but mass e^LOG_TAU
Z_BINS = 4  # default: "all_at_z" lets the adversary see h_z in this many bins per T (k >= 4)


class AttackPldOptions(TypedDict, total=False):
    """How an attack's PLD is discretised (`dataset_pld`): loss grid `loss_step` (default: the
    loss span / `n_atoms`, N_ATOMS), windows at tail level e^`log_tau` (LOG_TAU), and for k >= 4
    the number of h_z bins per T of "all_at_z" (`z_bins`, Z_BINS)."""

    loss_step: float | None
    n_atoms: int
    log_tau: float
    z_bins: int


def check_options(direction: str, log_tau: float, z_bins: int) -> None:
    """InvalidParameters for an impossible direction, truncation level or number of h_z bins."""
    if direction not in ("x0|x1", "x1|x0"):
        raise InvalidParameters(f"direction must be 'x0|x1' or 'x1|x0', got {direction!r}")
    if not (log_tau < -5):
        raise InvalidParameters("log_tau must be < -5")
    if z_bins < 1:
        raise InvalidParameters("z_bins must be >= 1")


def dataset_pld(
    mech: Mechanism,
    *,
    dataset: str,
    direction: str = "x0|x1",
    m: int | None = None,
    **options: Unpack[AttackPldOptions],
) -> PrivacyLossDistribution:
    """PLD of an explicit worst-case dataset: composing it gives a LOWER bound.

    dataset: "all_at_z" (k >= 3), "all_at_x0", "all_at_x1", "k2_m" (k = 2, m others at x0 and
    the rest at x1; `m` required). direction: "x0|x1" (law of log P_x0/P_x1 under P_x0) or
    "x1|x0"; for "all_at_z" both coincide. (`tight.attack_pld` also picks the dataset.)

    Discretisation: losses rounded DOWN to the grid (a composed delta is monotone in the losses,
    so this keeps a lower bound); mass outside the windows (level e^log_tau) is dropped, which
    also only lowers every delta. For k >= 4, "all_at_z" lets the adversary see h_z only in
    `z_bins` bins per T (a post-processing, hence still a lower bound; more bins are tighter).
    """
    log_tau, z_bins = options.get("log_tau", LOG_TAU), options.get("z_bins", Z_BINS)
    loss_step, n_atoms = options.get("loss_step"), options.get("n_atoms", N_ATOMS)
    check_query(mech)
    check_options(direction, log_tau, z_bins)
    ls, ms, desc = _dataset_atoms(mech, dataset, direction, m, log_tau, z_bins)
    loss_all = np.concatenate(ls) if ls else np.zeros(0)
    lm_all = np.concatenate(ms) if ms else np.zeros(0)
    sig = lm_all > (float(np.max(lm_all, initial=-math.inf)) - 80.0)
    span = float(np.ptp(loss_all[sig])) if np.any(sig) else mech.eps0
    step = loss_step if loss_step is not None else default_loss_step(max(span, 1e-12), n_atoms)
    if not (step > 0 and math.isfinite(step)):
        raise InvalidParameters(f"loss_step must be > 0, got {loss_step!r}")
    binner = LossBinner(step, up=False)
    binner.add(loss_all, lm_all)
    return binner.build(
        f"tight attack (lower bound): {desc}, n={mech.n}, k={mech.k}, eps0={mech.eps0}, "
        f"losses rounded down to step {step:.3g}, mass beyond e^{log_tau:g} windows dropped"
    )


def dataset_atoms(
    mech: Mechanism,
    *,
    dataset: str,
    direction: str = "x0|x1",
    m: int | None = None,
    log_tau: float = LOG_TAU,
    z_bins: int = Z_BINS,
) -> AtomChunks:
    """The exact atoms (losses, log P-masses) of the pair of `dataset_pld` (same arguments),
    chunk by chunk and before any rounding: for curves computed exactly (`curve_pld`)."""
    check_query(mech)
    check_options(direction, log_tau, z_bins)
    reverse = direction == "x1|x0"
    if dataset == "all_at_x1":
        dataset, reverse = "all_at_x0", not reverse
    if dataset == "all_at_z" and mech.k >= 3:
        return iter_all_at_z(mech, log_tau, z_bins)
    if dataset == "all_at_x0":
        return _iter_all_at_x0(mech, reverse, log_tau)
    ls, ms, _ = _dataset_atoms(mech, dataset, direction, m, log_tau, z_bins)
    return iter(list(zip(ls, ms, strict=True)))


def _dataset_atoms(
    mech: Mechanism, dataset: str, direction: str, m: int | None, log_tau: float, z_bins: int
) -> tuple[list[FloatArray], list[FloatArray], str]:
    """(losses, log masses, description) of a dataset's pair (see `dataset_pld`)."""
    reverse = direction == "x1|x0"
    if dataset == "all_at_x1":  # relabel x0 <-> x1: the reverse order of "all at x0"
        dataset, reverse = "all_at_x0", not reverse
    if dataset == "all_at_z":
        if mech.k < 3:
            raise InvalidParameters("all_at_z needs k >= 3")
        ls, ms = _pld_all_at_z(mech, log_tau, z_bins)
        desc = f"all others at z (h_z in {z_bins} bins per T)" if mech.k > 3 else "all at z"
    elif dataset == "all_at_x0":
        ls, ms = _pld_all_at_x0(mech, reverse, log_tau)
        desc = f"all others at x0 ({'x1|x0' if reverse else 'x0|x1'})"
    elif dataset == "k2_m":
        if mech.k != 2:
            raise InvalidParameters("k2_m needs k = 2")
        if m is None or not (0 <= m <= mech.n - 1):
            raise InvalidParameters(f"k2_m needs 0 <= m <= n-1, got {m!r}")
        ls, ms = _pld_k2_m(mech, int(m), reverse, log_tau)
        desc = f"{m} others at x0, {mech.n - 1 - m} at x1 ({'x1|x0' if reverse else 'x0|x1'})"
    else:
        raise InvalidParameters(f"unknown dataset {dataset!r}")
    return ls, ms, desc
