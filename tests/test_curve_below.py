"""Curves below t = 1 from below (`CurveCells.curve_below`): for a proper pair h(t) = (1 - t) + g(t)
with g summed over the atoms below t, accurate where h - (1 - t) is tiny; the attack's lower grid
uses it (`lower_grid(proper=True)`) and stays below the exact curve."""

from __future__ import annotations

import math

import numpy as np
from scipy.stats import binom

from shufflekit.accountant.curve_cells import (
    CurveCells,
    _lower_hull,
    _quickhull_chords,
    _quickhull_lower,
    lower_grid,
)


def _pair(n: int, eps0: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Atoms of k = 2, "all others at x0": (losses, P, Q) exactly from binomial pmfs."""
    p = math.exp(eps0) / (1 + math.exp(eps0))
    s = np.arange(n + 1)
    b = binom.pmf(s, n - 1, p)
    b_prev = np.concatenate(([0.0], b[:-1]))
    big_p = p * b_prev + (1 - p) * b
    big_q = (1 - p) * b_prev + p * b
    keep = (big_p > 1e-300) & (big_q > 1e-300)
    return np.log(big_p[keep] / big_q[keep]), big_p[keep], big_q[keep]


def _exact(big_p: np.ndarray, big_q: np.ndarray, t: np.ndarray) -> np.ndarray:
    return np.array([np.sum(np.maximum(big_p - x * big_q, 0.0)) for x in t])


def _grid_curve(probs: np.ndarray, losses: np.ndarray, t: np.ndarray) -> np.ndarray:
    return np.array([np.sum(probs * np.maximum(1.0 - x * np.exp(-losses), 0.0)) for x in t])


def test_below_one_the_curve_is_one_minus_t_plus_g() -> None:
    losses, big_p, _ = _pair(400, 1.0)
    cells = CurveCells.empty(1e-3, -1.0, 1.0, rel_error=1e-12)
    cells.add(losses, np.log(big_p))
    g, allow = cells.curve_below()
    t = np.exp(cells.losses())
    _, big_q = _pair(400, 1.0)[1:]
    exact = _exact(big_p, big_q, t)
    neg = t < 1.0
    err = np.abs((1.0 - t) + g - exact)[neg]
    assert np.all(err <= allow[neg] + 1e-15)
    # and far more accurate than summing from above where h - (1 - t) is small
    _, allow_up = cells.curve()
    small = neg & (g < 1e-6)
    assert np.any(small)
    assert np.all(allow[small] < 1e-3 * allow_up[small])


def test_the_proper_lower_grid_stays_below_the_exact_curve_and_is_tighter() -> None:
    losses, big_p, big_q = _pair(2000, 0.5)
    cells = CurveCells.empty(1e-4, -0.5, 0.5, rel_error=1e-9)
    cells.add(losses, np.log(big_p))
    t = np.exp(np.linspace(-0.2, 0.2, 801))
    exact = _exact(big_p, big_q, t)
    deficits = []
    for proper in (False, True):
        grid = lower_grid(cells, 2e-4, "test", proper=proper)
        curve = _grid_curve(grid.probs, grid.losses, t)
        assert np.all(curve <= exact + 1e-15), float(np.max(curve - exact))
        below = (t < 1.0) & (exact - np.maximum(1.0 - t, 0.0) > 1e-12)
        excess = (exact - (1.0 - t))[below]
        deficits.append(float(np.max((exact - curve)[below] / excess)))
    assert deficits[1] < deficits[0]


def test_curve_at_any_grid_point_brackets_the_exact_curve() -> None:
    """`curve_at`: cells over the atoms' own range give the exact curve (within the allowance)
    at points of a coarser grid below, inside and above that range."""
    losses, big_p, big_q = _pair(300, 0.8)
    mass = big_p.copy()
    mass[:3] *= 1 + 1e-9  # masses off by their stated relative error at most
    cells = CurveCells.empty(1e-4, float(losses.min()), float(losses.max()), rel_error=1e-9)
    cells.add(losses, np.log(mass))
    step = 5e-4
    first = math.floor(losses.min() / step) - 40  # 40 points below the cells
    size = math.ceil(losses.max() / step) + 40 - first  # and 40 above
    h, allow = cells.curve_at(step, first, size)
    t = np.exp((first + np.arange(size)) * step)
    exact = _exact(big_p, big_q, t)
    assert np.all(h - allow <= exact) and np.all(exact <= h + allow)
    assert np.all(allow <= 1e-8)
    below = (first + np.arange(size)) * step < cells.first * cells.step
    assert below.sum() >= 40 and np.all(h[-30:] == 0.0)


def _monotone_chain(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The lower hull by Andrew's monotone chain, one point at a time (the reference)."""
    out: list[int] = []
    for i in range(x.size):
        while len(out) >= 2:
            o, a = out[-2], out[-1]
            if (y[a] - y[o]) * (x[i] - x[a]) > (y[i] - y[a]) * (x[a] - x[o]):
                out.pop()
            else:
                break
        out.append(i)
    return np.asarray(out)


def test_lower_hull_matches_the_monotone_chain_on_cascades_and_noise() -> None:
    """A plateau ending in a drop made the vectorised passes drop one point each, and the
    Python chain that took over spent 84 s on 2 million points (eps0 = 60): chords are now
    split at their farthest point below. Same piecewise-linear function as the chain."""
    rng = np.random.default_rng(5)
    for trial in range(240):
        n = int(rng.integers(3, 3000))
        x = np.unique(np.sort(rng.random(n)) * 10 ** rng.uniform(-3, 3))
        kind = trial % 4
        if kind == 0:
            y = rng.random(x.size)
        elif kind == 1:
            y = np.exp(-x) + rng.random(x.size) * 1e-3
        else:  # plateaus ending in a drop, with a convex start (what the passes cascade on)
            y = np.full(x.size, 2.0)
            y[-1] = 0.0 if kind == 2 else 1.999
            y[: x.size // 3] = np.linspace(5.0, 2.0, x.size // 3)
        hull, chain = _lower_hull(x, y), _monotone_chain(x, y)
        assert hull[0] == 0 and hull[-1] == x.size - 1
        assert np.allclose(np.interp(x, x[hull], y[hull]), np.interp(x, x[chain], y[chain]))


def test_chords_split_together_keep_the_vertices_of_one_by_one() -> None:
    """The chords of one depth are split in one array operation (a hull of 1e5 vertices took
    1e5 steps, most of `calibrate_eps0`'s time): the vertices are exactly those of splitting
    chord by chord, ties (the first of equal minima), plateaus and NaNs included."""
    rng = np.random.default_rng(11)
    for trial in range(300):
        n = int(rng.integers(3, 4000))
        x = np.unique(np.sort(rng.random(n)) * 10 ** rng.uniform(-3, 3))
        kind = trial % 5
        if kind == 0:
            y = rng.random(x.size)
        elif kind == 1:  # ties: integer points, many at equal depth below a chord
            x = np.arange(float(n))
            y = rng.integers(0, 4, n).astype(float)
        elif kind == 2:  # a convex curve: nearly every point is a vertex
            y = np.exp(-x / x[-1]) + rng.random(x.size) * 1e-9
        elif kind == 3:  # a plateau ending in a drop
            y = np.full(x.size, 2.0)
            y[-1] = 0.0
        else:
            y = rng.random(x.size)
            y[rng.integers(0, x.size, 3)] = np.nan
        idx = np.arange(x.size)
        keep = np.zeros(x.size, dtype=bool)
        keep[[0, -1]] = True
        one = _quickhull_chords(x, y, idx, keep, [(0, x.size - 1)])
        assert np.array_equal(_quickhull_lower(x, y, idx), one), trial
