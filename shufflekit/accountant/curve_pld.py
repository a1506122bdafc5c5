"""PLDs that put themselves on a composition grid from an exact curve, instead of rounding
their atoms: the k = 2 dominating pair (upper side) and the attacks' exact pairs (lower side).

`composition.compose` / `compose_lower` call `CurvePLD.on_grid(step, upper)` for such a round
(plain `PrivacyLossDistribution`s are gridded by `numerics.grid.discretise`). The inherited
`losses` / `log_probs` hold the same pair on a fixed fine grid (upper: the hull at 1e-3; lower:
the exact atoms' cells at the base step, rounded down), so every other use of a PLD still
gets a bound of the right side.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np

from shufflekit.accountant.attack_cells import all_at_z_cells, all_at_z_loss_sd
from shufflekit.accountant.attack_pld import dataset_atoms
from shufflekit.accountant.core import Mechanism, PrivacyLossDistribution, check_query
from shufflekit.accountant.curve_cells import CurveCells, lower_grid, upper_grid
from shufflekit.accountant.k2_compose import ATOMS_MAX_N, CELL_STEPS, CELLS_RTOL, MAX_N, K2Pair
from shufflekit.accountant.numerics.grid import GridPLD, discretise
from shufflekit.accountant.numerics.lru import BoundedLRU
from shufflekit.accountant.numerics.pmf_sum import clear_sums
from shufflekit.accountant.tight_upper import tight_pld
from shufflekit.base.errors import InvalidParameters

#: The curves' base steps are CELL_STEPS (`k2_compose`): the first divides every default
#: composition step (`composition.GRID_STEPS`), the finer ones serve rounds whose losses spread
#: less than 8 x it (many users, small eps0), so that the composition grid can follow.
_MAX_BASE_CELLS = 4_000_000


@dataclass(frozen=True)
class CurvePLD(PrivacyLossDistribution):
    """A PLD with its own gridding: `make_grid(step)` gives the GridPLD of the side `upper`."""

    make_grid: Callable[[float], GridPLD] | None = None
    upper: bool = True
    _grids: dict[float, GridPLD] = field(default_factory=dict, repr=False, compare=False)
    payload_bytes: int = 0  # memory held besides losses / log_probs (for cache budgets)

    def on_grid(self, step: float, upper: bool) -> GridPLD:
        """This pair on the grid {j step}, as a bound of side `upper` (cached per step)."""
        if upper != self.upper or self.make_grid is None:
            side = "an upper" if self.upper else "a lower"
            raise InvalidParameters(f"this PLD is {side} bound only: {self.description}")
        hit = self._grids.get(step)
        if hit is None:
            hit = self.make_grid(step)
            self._grids[step] = hit
        return hit


def _as_pld(g: GridPLD) -> tuple[np.ndarray, np.ndarray, float]:
    nz = g.probs > 0
    return g.losses[nz], np.log(g.probs[nz]), g.log_inf_mass


# ----------------------------------------------------------------------------- k = 2

_K2: BoundedLRU[tuple[int, float], K2Pair] = BoundedLRU(
    4, 512 << 20, lambda pair: sum(lf.nbytes for lf in pair.leaves)
)  # a pair of n = 1e7 holds up to ~250 MB of atoms (above, wide leaves keep ~30 KB of cells)


def clear_k2_caches() -> None:
    """Forget the k = 2 pairs and the binomial windows and sums they were built from."""
    _K2.clear()
    clear_sums()


def k2_pair(mech: Mechanism) -> K2Pair:
    """The refined k = 2 leaves of `mech` (cached for the 4 most recent mechanisms)."""
    key = (int(mech.n), float(mech.eps0))
    hit = _K2.get(key)
    if hit is not None:
        return hit
    # a looser refinement where leaves keep cells: at n = 1e8, eps0 = 1, 3% takes 343 leaves
    # and 27 s for composed gaps of 0.50-0.83%, 1% 535 leaves and 43 s for 0.48-0.81%
    rtol = CELLS_RTOL if mech.n > ATOMS_MAX_N else 1e-2
    return _K2.put(key, K2Pair(mech, rtol=rtol))


def k2_upper_pld(mech: Mechanism) -> CurvePLD:
    """Dominating pair of one k = 2 round from the certified leaves (`k2_compose`).

    The max curve is kept at the grid points of the pair's base step only (`K2Pair.base_step`,
    one of CELL_STEPS; not the leaves: memory); a composition step that is a multiple of it
    takes every r-th value (each is an upper bound of the curve at its point, which is all
    `upper_grid` needs), a finer step takes the hull at that step from the (cached) leaves
    where they keep atoms (n <= ATOMS_MAX_N), any other step falls back to splitting the hull
    at the base step onto the grid (`numerics.grid.discretise`, also sound).
    """
    check_query(mech)
    pair = k2_pair(mech)
    bstep = pair.base_step()
    first, vals = pair.upper_values(bstep)
    vals[-1] = max(pair.tail_mass(bstep), float(vals[-1]))
    base = upper_grid(bstep, first, vals, float(vals[-1]), f"k2:{mech.n}:{mech.eps0!r}")

    def make(step: float) -> GridPLD:
        r = round(step / bstep)
        if step < bstep and pair.cell_step is None:  # finer still: from the leaves' atoms
            j, v = pair.upper_values(step)
            v[-1] = max(pair.tail_mass(step), float(v[-1]))
            return upper_grid(step, j, v, float(v[-1]), f"k2:{mech.n}:{mech.eps0!r}:{step!r}")
        if r < 1 or abs(step / bstep - r) > 1e-9 * r:
            return discretise(fallback, step)
        j0 = -((-first) // r)  # first multiple of r at or after `first`
        sub = vals[j0 * r - first :: r]
        tail = float(vals[-1])  # beyond the last point: the curve is below the tail bound
        sub = np.maximum(sub, tail)
        return upper_grid(step, j0, sub, tail, f"k2:{mech.n}:{mech.eps0!r}:{step!r}")

    losses, lps, lim = _as_pld(base)
    fallback = PrivacyLossDistribution(losses, lps, lim, "k = 2 hull at the base step")
    return CurvePLD(
        losses,
        lps,
        lim,
        f"k = 2 dominating pair: max over {len(pair.leaves)} certified dataset intervals "
        f"({'converged' if pair.converged else 'not converged: looser'} to "
        f"rtol {pair.rtol:g}), n={mech.n}, eps0={mech.eps0}; hull on the composition grid",
        make,
        True,
        {bstep: base},
        int(vals.nbytes),
    )


def composition_pld(mech: Mechanism) -> PrivacyLossDistribution:
    """The per-round dominating pair composed by default: the k = 2 pair for k = 2 and
    n <= MAX_N (tight), else the blanket pair `tight_upper.tight_pld`."""
    if mech.k == 2 and mech.n <= MAX_N:
        return k2_upper_pld(mech)
    return tight_pld(mech)


# ----------------------------------------------------------------------------- attacks


def _cells(
    atoms: Iterable[tuple[np.ndarray, np.ndarray, np.ndarray | None]],
    step: float,
    lo: float,
    hi: float,
) -> CurveCells:
    """The atoms (chunk by chunk: never all in memory) summed into cells over [lo, hi]."""
    cells = CurveCells.empty(step, lo, hi, rel_error=1e-7)
    for loss, lm, rel in atoms:
        cells.add(loss, lm, rel=rel)
    return cells


def _dataset_cells(mech: Mechanism, dataset: str, step: float, lo: float, hi: float) -> CurveCells:
    """The cells of a dataset's exact pair: "all_at_z" summed row by row in closed form
    (`attack_cells`), any other dataset atom by atom."""
    if dataset == "all_at_z" and mech.k >= 3:
        return all_at_z_cells(mech, step, lo, hi)
    return _cells(_atoms(mech, dataset), step, lo, hi)


def _atoms(
    mech: Mechanism, dataset: str
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray | None]]:
    """Exact atoms (losses, log P-masses, relative errors beyond 1e-7 or None) of a dataset;
    "k2_m=M": the k = 2 leaf of m = M."""
    if dataset.startswith("k2_m="):
        m = int(dataset.split("=")[1])
        lf = k2_pair(mech).exact_leaf(m)
        return iter([(lf.losses, lf.log_mass, lf.rels)])
    return ((loss, lm, None) for loss, lm in dataset_atoms(mech, dataset=dataset))


def _attack_base(mech: Mechanism, dataset: str) -> float:
    """The base step of an attack's cells: the largest of CELL_STEPS within the pair's loss
    spread / 8 with a margin (every composition step `default_grid` may then choose for it is
    a multiple: one pass over the outcomes), within the cell budget (else 1e-3)."""
    fits = [s for s in CELL_STEPS if 2 * mech.eps0 / s <= _MAX_BASE_CELLS]
    if not fits:
        return 1e-3
    if dataset != "all_at_z" or mech.k < 3:
        return fits[0]
    sd = all_at_z_loss_sd(mech)
    return next((s for s in fits if sd / 8 >= 1.25 * s), fits[-1])


def attack_curve_pld(mech: Mechanism, dataset: str = "auto") -> CurvePLD:
    """The exact pair of one explicit dataset, put on a composition grid optimistically
    (`curve_cells.lower_grid`): composing it gives a lower bound.

    dataset: "auto" (k = 2: the worst exact dataset of the k = 2 leaves; k >= 3: "all_at_z"),
    or any dataset of `attack_pld.dataset_pld` ("all_at_z", "all_at_x0", "all_at_x1"), order
    x0|x1. Masses carry a relative allowance of 1e-7 (as `tight`'s attack).
    """
    check_query(mech)
    if dataset == "auto" and mech.k == 2 and mech.n <= MAX_N:
        m = k2_pair(mech).worst_atoms().m1
        dataset = f"k2_m={m}"
        desc = f"{m} others at x0, {mech.n - 1 - m} at x1 (x0|x1)"
    else:
        if dataset == "auto":
            dataset = "all_at_z" if mech.k >= 3 else "all_at_x0"
        desc = dataset
    lo, hi = -mech.eps0, mech.eps0  # k-RR is eps0-LDP: every loss of a pair is in there
    base = _attack_base(mech, dataset)
    cells = _dataset_cells(mech, dataset, base, lo, hi)

    def make(step: float) -> GridPLD:
        ratio = step / base
        if abs(ratio - round(ratio)) <= 1e-9 * ratio:
            return lower_grid(cells, step, f"attack:{mech}:{desc}:{step!r}", proper=True)
        again = _dataset_cells(mech, dataset, step, lo, hi)
        return lower_grid(again, step, f"attack:{mech}:{desc}:{step!r}", proper=True)

    fine = make(1e-4 if base <= 1e-4 else base)
    losses, lps, _ = _as_pld(fine)
    return CurvePLD(
        losses,
        lps,
        -math.inf,
        f"attack (lower bound): exact pair of {desc}, n={mech.n}, k={mech.k}, "
        f"eps0={mech.eps0}; put on the composition grid below its exact curve",
        make,
        False,
        {},
        int(cells.w.nbytes * 3),
    )
