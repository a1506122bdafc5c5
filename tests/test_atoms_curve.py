"""Curves of atoms in closed form (`curve_cells.AtomsCurve`) and the k = 2 pair's max over its
leaves from breakpoints only (`K2Pair._envelope`), which replaced a pass over every cell of
[-eps0, eps0] per leaf (27 s for 3 rounds at n = 1e4, eps0 = 10). Checked against 50-digit
mpmath curves of the same atoms with every mass moved by its stated relative error the worst
way, and against the cells' curves the old code took the max of."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest

from shufflekit.accountant.core import Mechanism
from shufflekit.accountant.curve_cells import AtomsCurve, CurveCells
from shufflekit.accountant.curve_pld import hull_pld
from shufflekit.accountant.k2_compose import _REL, CommonGrid, K2Pair, Leaf, _rr_curve
from shufflekit.accountant.rdp_filter import filter_epsilon, rdp_curve

mpmath.mp.dps = 50


def _worst_curves(
    loss: np.ndarray, log_mass: np.ndarray, rho: np.ndarray, s: float
) -> tuple[float, float]:
    """(largest, smallest) curve at e^s of the atoms whose P- and Q-masses are within a
    relative rho of the given ones (Q = P e^-loss), in 50-digit arithmetic."""
    t = mpmath.exp(mpmath.mpf(s))
    hi = lo = mpmath.mpf(0)
    for li, lm, r in zip(loss, log_mass, rho, strict=True):
        w = mpmath.exp(mpmath.mpf(float(lm)))
        q = w * mpmath.exp(-mpmath.mpf(float(li)))
        r = mpmath.mpf(float(r))
        hi += max(w * (1 + r) - t * q * (1 - r), 0)
        lo += max(w * (1 - r) - t * q * (1 + r), 0)
    return float(hi), float(lo)


def _atoms(seed: int, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    loss = np.sort(rng.uniform(-3.0, 3.0, size))
    loss[3] = loss[4]  # a repeated loss
    log_mass = np.log(rng.dirichlet(np.ones(size)))
    rel = rng.choice([0.0, 1e-12, 1e-6, 1e-3], size)
    return loss, log_mass, rel


@pytest.mark.parametrize("seed", [0, 1])
def test_atoms_curve_brackets_every_pair_within_the_stated_errors(seed: int) -> None:
    """At random losses and at, just below and just above every atom (where an atom's error
    may still count), h - allowance <= the smallest and h + allowance >= the largest curve
    of the atoms with masses moved by rel_error + rel; the allowance is no larger than twice
    the errors of the atoms that can count plus round-off."""
    loss, log_mass, rel = _atoms(seed, 40)
    curve = AtomsCurve(loss[::-1], log_mass[::-1], 1e-9, rel[::-1])  # (given unsorted)
    rho = 1e-9 + rel
    rng = np.random.default_rng(seed + 10)
    near = np.concatenate([loss, loss - 1e-12, loss - 1.5e-9, loss - 1e-3, loss + 1e-12])
    pts = np.concatenate([rng.uniform(-4.0, 4.0, 60), near, [-50.0, 50.0]])
    h, allow = curve.at(pts)
    for s, hs, al in zip(pts, h, allow, strict=True):
        hi, lo = _worst_curves(loss, log_mass, rho, float(s))
        assert hs + al >= hi
        assert hs - al <= lo
        counts = loss + np.log1p(2 * rho / (1 - rho)) > s
        assert al <= 2.0 * float(np.sum((rho + 2e-12) * np.exp(log_mass) * counts)) + 2e-300


def test_atoms_curve_agrees_with_the_cells_on_a_grid() -> None:
    """On a grid, the closed form and `CurveCells.curve` (the old code's) agree within their
    allowances."""
    loss, log_mass, rel = _atoms(3, 200)
    cells = CurveCells.empty(1e-3, -3.0, 3.0, rel_error=1e-9)
    cells.add(loss, log_mass, rel=rel)
    h_cells, allow_cells = cells.curve()
    h, allow = AtomsCurve(loss, log_mass, 1e-9, rel).at(cells.losses())
    assert np.all(np.abs(h - h_cells) <= allow + allow_cells)


def test_cells_curve_counts_an_atom_whose_true_loss_is_many_cells_up() -> None:
    """On a step far finer than an atom's error (1e-5 against 1e-3: a loss up to 2e-3 off),
    `CurveCells.curve` + allowance is above the largest curve of the atoms moved by their
    errors at grid points up to 200 cells above each atom (it counted one cell: 1e-4 short)."""
    loss, log_mass, rel = _atoms(4, 40)
    step = 1e-5
    cells = CurveCells.empty(step, -3.0, 3.0, rel_error=1e-9)
    cells.add(loss, log_mass, rel=rel)
    h, allow = cells.curve()
    grid = cells.losses()
    for li in loss:
        for up in (1, 2, 5, 20, 100, 200):
            j = int(np.floor(li / step)) + up - cells.first
            hi, lo = _worst_curves(loss, log_mass, 1e-9 + rel, float(grid[j]))
            assert h[j] + allow[j] >= hi, (li, up)
            assert h[j] - allow[j] <= lo, (li, up)


def _leaf_worst(pair: K2Pair, lf: Leaf, s: float) -> float:
    """The largest curve at e^s of a leaf's pair within its stated errors (mpmath)."""
    rho = _REL + (np.zeros(lf.losses.size) if lf.rels is None else lf.rels)
    hi = _worst_curves(lf.losses, lf.log_mass, rho, s)[0]
    rr = lf.rr_weight * float(_rr_curve(pair.mech, np.array([s]))[0]) * (1.0 + _REL)
    return hi + lf.inf_mass + rr


@pytest.mark.parametrize(("n", "eps0"), [(300, 10.0), (40, 3.0)])
def test_k2_envelope_is_sound_and_as_tight_as_the_cells(n: int, eps0: float) -> None:
    """The max over the leaves from breakpoints: at sampled grid points (among them the
    points where the max changes hands) at least every leaf's largest curve in mpmath, and
    everywhere at most the old max of the cells' curves times 1 + 1e-3 plus 1e-11 (the
    round-off allowed twice) -- and above the top atom the +inf and RR masses alone."""
    pair = K2Pair(Mechanism(n, 2, eps0))
    step = pair.base_step()
    first, new = pair.upper_values(step)
    old = pair.cells_upper_values(step)[1]
    lo, hi = pair._range()
    lo, hi = max(lo, -eps0), min(hi, eps0)
    grid = CommonGrid(step, lo, hi)
    assert first == grid.first
    s = grid.losses()
    assert new.shape == old.shape
    assert np.all(new <= old * (1.0 + 1e-3) + 1e-11)
    # where the leaf giving the max changes (the chord is not used there) and elsewhere
    best = np.argmax(np.stack([pair._curve(lf, step, lo, hi)[0] for lf in pair.leaves]), 0)
    switch = np.flatnonzero(np.diff(best) != 0)
    rng = np.random.default_rng(n)
    picks = np.unique(np.concatenate([switch[:12], switch[:12] + 1, rng.integers(0, s.size, 16)]))
    for i in picks:
        assert new[i] >= max(_leaf_worst(pair, lf, float(s[i])) for lf in pair.leaves)


def test_k2_envelope_ends_at_the_infinite_mass_above_the_top_atom() -> None:
    """One grid step above every atom (and its errors' reach) the curve is the leaves' +inf
    mass (no RR part at eps0 = 10), where the cells kept an atom's allowance a cell too far
    (1.3e-9 at n = 300: an infinite-loss mass no composed delta can go below)."""
    pair = K2Pair(Mechanism(300, 2, 10.0))
    _, new = pair.upper_values(pair.base_step())
    top = max(
        lf.inf_mass + lf.rr_weight * float(_rr_curve(pair.mech, np.array([10.0]))[0])
        for lf in pair.leaves
    )
    assert new[-2] == pytest.approx(top, rel=1e-6)
    assert math.isfinite(new[-2]) and new[-2] < 1e-20


def test_k2_envelope_keeps_the_renyi_curve_of_the_cells() -> None:
    """High Rényi orders weigh the top of the curve by e^(alpha loss): n = 1000, eps0 = 2 at
    delta = 1e-12 charged 0.742 from the cells' max and 0.952 from an envelope that added
    one leaf's allowance (1e-35) to another leaf's curve up to loss 2.0. The envelope takes
    each leaf's curve with its own allowance, as the cells' max did: the same filter epsilon."""
    pair = K2Pair(Mechanism(1000, 2, 2.0))
    step = pair.base_step()
    charged = []
    for first, vals in (pair.upper_values(step), pair.cells_upper_values(step)):
        vals[-1] = max(pair.tail_mass(step), float(vals[-1]))
        rho, _ = rdp_curve(hull_pld(step, first, vals, "test"))
        charged.append(filter_epsilon(rho, 1e-12))
    assert charged[0] == pytest.approx(charged[1], rel=1e-9)
