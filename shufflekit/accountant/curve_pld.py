"""PLDs that put themselves on a composition grid from an exact curve, instead of rounding
their atoms: the k = 2 dominating pair (upper side) and the attacks' exact pairs (lower side).

`composition.compose` / `compose_lower` call `CurvePLD.on_grid(step, upper)` for such a round
(plain `PrivacyLossDistribution`s are gridded by `numerics.grid.discretise`). The inherited
`losses` / `log_probs` hold the same pair on a fixed fine grid (upper: the hull at 1e-3; lower:
the exact atoms' cells at the base step, rounded down), so every other use of a PLD still
gets a bound of the right side.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np

from shufflekit.accountant.attack_cells import all_at_z_cells, all_at_z_loss_sd
from shufflekit.accountant.attack_pld import dataset_atoms
from shufflekit.accountant.blanket_cells import blanket_cells, blanket_loss_sd
from shufflekit.accountant.core import Mechanism, PrivacyLossDistribution, check_query
from shufflekit.accountant.curve_cells import CurveCells, lower_grid, steps_that_fit, upper_grid
from shufflekit.accountant.k2_compose import ATOMS_MAX_N, CELLS_RTOL, MAX_N, K2Pair
from shufflekit.accountant.numerics.grid import GridPLD, discretise
from shufflekit.accountant.numerics.lru import BoundedLRU
from shufflekit.accountant.numerics.pmf_sum import clear_sums
from shufflekit.base.arrays import FloatArray
from shufflekit.base.errors import InvalidParameters

#: Base steps of the k >= 3 curves (attack and blanket): each divides every step of
#: `composition.GRID_STEPS` at or above it, so cells at a base no coarser than the composition
#: grid serve it in one pass. A round whose losses spread less (many users, small eps0) gets a
#: finer base; the k = 2 pair keeps its own ladder (`k2_compose.CELL_STEPS`).
CURVE_STEPS = (5e-5, 1e-5, 5e-6, 1e-6, 5e-7)
_MAX_BASE_CELLS = 4_000_000


@dataclass(frozen=True)
class CurvePLD(PrivacyLossDistribution):
    """A PLD with its own gridding: `make_grid(step)` gives the GridPLD of the side `upper`."""

    make_grid: Callable[[float], GridPLD] | None = None
    upper: bool = True
    _grids: dict[float, GridPLD] = field(default_factory=dict, repr=False, compare=False)
    payload_bytes: int = 0  # memory held besides losses / log_probs (for cache budgets)
    #: An upper side's values (base step, first index, upper bounds of the curve there) that
    #: rebuild it (`hull_pld`): what the curve cache stores, so a reloaded pair gives the
    #: same composed numbers as a fresh one.
    hull: tuple[float, int, FloatArray] | None = field(default=None, repr=False, compare=False)

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
    one of CELL_STEPS; not the leaves: memory) as a `hull_pld`; a finer step takes the hull at
    that step from the (cached) leaves where they keep atoms (n <= ATOMS_MAX_N).
    """
    check_query(mech)
    pair = k2_pair(mech)
    bstep = pair.base_step()
    first, vals = pair.upper_values(bstep)
    vals[-1] = max(pair.tail_mass(bstep), float(vals[-1]))

    def finer(step: float) -> GridPLD:
        j, v = pair.upper_values(step)
        v[-1] = max(pair.tail_mass(step), float(v[-1]))
        return upper_grid(step, j, v, float(v[-1]), f"k2:{mech.n}:{mech.eps0!r}:{step!r}")

    return hull_pld(
        bstep,
        first,
        vals,
        f"k = 2 dominating pair: max over {len(pair.leaves)} certified dataset intervals "
        f"({'converged' if pair.converged else 'not converged: looser'} to "
        f"rtol {pair.rtol:g}), n={mech.n}, eps0={mech.eps0}; hull on the composition grid",
        finer if pair.cell_step is None else None,
    )


def hull_pld(
    base: float,
    first: int,
    vals: FloatArray,
    description: str,
    finer: Callable[[float], GridPLD] | None = None,
) -> CurvePLD:
    """The dominating pair whose curve is the hull of upper bounds `vals[i]` >= h(e^((first +
    i) base)) of a proper pair's curve (`vals[-1]` also bounds it beyond: +inf mass).

    A composition step that is a multiple of `base` takes every r-th value (each is an upper
    bound of the curve at its point, which is all `upper_grid` needs); a finer step calls
    `finer` if given; any other step splits the hull at the base step onto the grid
    (`numerics.grid.discretise`, also sound).
    """
    vals = np.asarray(vals, dtype=np.float64)
    key = f"hull:{base!r}:{first}:{hashlib.sha256(vals.tobytes()).hexdigest()[:16]}"
    base_grid = upper_grid(base, first, vals, float(vals[-1]), key)
    losses, lps, lim = _as_pld(base_grid)
    fallback = PrivacyLossDistribution(losses, lps, lim, "hull at the base step")

    def make(step: float) -> GridPLD:
        r = round(step / base)
        if step < base and finer is not None:
            return finer(step)
        if r < 1 or abs(step / base - r) > 1e-9 * r:
            return discretise(fallback, step)
        j0 = -((-first) // r)  # first multiple of r at or after `first`
        tail = float(vals[-1])  # beyond the last point: the curve is below the tail bound
        sub = np.maximum(vals[j0 * r - first :: r], tail)
        if (j0 + sub.size - 1) * r < first + vals.size - 1:  # a point past the last one, so
            sub = np.append(sub, tail)  # the hull ends at the tail, not at a value before it
        return upper_grid(step, j0, sub, tail, f"{key}:{step!r}")

    return CurvePLD(
        losses,
        lps,
        lim,
        description,
        make,
        True,
        {base: base_grid},
        int(vals.nbytes),
        (base, first, vals),
    )


def composition_pld(mech: Mechanism) -> PrivacyLossDistribution:
    """The per-round dominating pair composed by default: the k = 2 pair for k = 2 and
    n <= MAX_N (tight), else the blanket pair (`blanket_pld`)."""
    if mech.k == 2 and mech.n <= MAX_N:
        return k2_upper_pld(mech)
    return blanket_pld(mech)


# ----------------------------------------------------------------------------- blanket


def blanket_pld(mech: Mechanism) -> CurvePLD:
    """The blanket pair behind `tight`'s upper bound (`tight_upper.tight_pld`'s pair: the same
    buckets and windows), put on a composition grid from its exact curve (`upper_grid`).

    Its cells (`blanket_cells`) are kept at a base step of CURVE_STEPS
    chosen from the loss spread, so that every step `default_grid` picks is a multiple: there
    the curve is exact at every grid point up to the cells' float allowance, plus the mass
    left out of the cells (as +inf); another step splits the hull (`hull_pld`). Unlike
    rounding each loss up (`tight_pld`), the hull's error is of second order in the step, and
    no per-bucket table over every T is held where rows are summed (tight_pld peaks at 5.5 GB
    at n = 1e9). With few users the rows are too narrow to pay (`row_cells.rows_pay`): their
    atoms go into the cells one by one, from `tight_pld`'s kernel.
    """
    check_query(mech)
    base = _base_step(mech, blanket_loss_sd(mech))
    cells = blanket_cells(mech, base)
    first, size = cells.first, cells.w.size + 1  # and one point above the cells: h = 0 there
    h, allow = cells.curve_at(base, first, size)
    return hull_pld(
        base,
        first,
        h + allow + cells.inf_mass,
        f"tight upper: blanket pair (others' blanket bits revealed), n={mech.n}, k={mech.k}, "
        f"eps0={mech.eps0}; exact curve in cells of {base:g}, hull on the composition grid",
    )


def _base_step(mech: Mechanism, sd: float) -> float:
    """The largest of CURVE_STEPS within the loss spread `sd` / 8 with a margin of 1.25 (so
    that every step `default_grid` may choose for the pair is a multiple: one pass over its
    outcomes), within the cell budget (else `curve_cells.WIDE_STEP`)."""
    fits = steps_that_fit(CURVE_STEPS, mech.eps0, _MAX_BASE_CELLS)
    return next((s for s in fits if sd / 8 >= 1.25 * s), fits[-1])


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
    """The base step of an attack's cells (`_base_step`; the loss spread of "all_at_z" from
    its closed form, any other dataset at the coarsest step that fits)."""
    if dataset != "all_at_z" or mech.k < 3:
        return _base_step(mech, math.inf)
    return _base_step(mech, all_at_z_loss_sd(mech))


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
