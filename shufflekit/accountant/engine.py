"""The composition-engine interface: what an engine is given (gridded rounds and their counts),
what it returns (`ComposedGrid`), and the pieces every engine shares.

An engine composes privacy loss distributions that are already on one loss grid
(`numerics.grid.discretise`); `accountant.composition` picks one by name and turns its output
into queryable bounds. Two implement it, each a `GridEngine` over its compose function:
`compose_dpa.compose_dpa` (Google's dp_accounting, the default) and `compose_fft.compose_fft`
(our Fourier accountant).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from shufflekit.accountant.numerics.grid import GridMasses, GridPLD
from shufflekit.accountant.numerics.logspace import exp_of, log_of, logsumexp
from shufflekit.base.errors import InvalidParameters

_U = 2.0**-53


@dataclass(frozen=True, eq=False)
class ComposedGrid(GridMasses):
    """A composed PLD on the grid, as an engine returns it (before any query).

    `probs` is the raw engine output: it may hold round-off of either sign. `inf_mass` (upper
    side): input infinite mass and truncations, composed exactly. The three error terms are
    additive bounds on |delta_engine(eps) - delta_exact_grid(eps)| for every eps:
    `alias_error` (FFT wrap-around, a Chernoff bound), `truncation_slack` (mass an engine moved
    to +inf: already inside `inf_mass`, so only looseness, reported for the accuracy check),
    `fp_error` (floating-point estimate of FFT round-off).
    """

    rounds: int
    alias_error: float = 0.0
    truncation_slack: float = 0.0
    fp_error: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)


def compose_inf_mass(
    grids: list[GridPLD], counts: list[int], upper: bool = True
) -> tuple[float, float]:
    """(inf_mass, log_inf_mass) of the composition: 1 - prod (1 - d_r)^{c_r}, in log space.

    When the d_r underflow, an upper bound uses the union bound sum c_r d_r in log space (a
    lower bound keeps the float value, possibly 0).
    """
    s = 0.0
    for g, c in zip(grids, counts, strict=True):
        if g.inf_mass >= 1.0:
            return 1.0, 0.0
        s += c * math.log1p(-g.inf_mass)
    d = -math.expm1(s)
    if d > 1e-300 or not upper:
        return d, log_of(d)
    terms = [math.log(c) + g.log_inf_mass for g, c in zip(grids, counts, strict=True)]
    ld = logsumexp(np.asarray(terms, dtype=np.float64))
    return exp_of(ld), ld


class CompositionEngine(Protocol):
    """Composes gridded per-round PLDs: counts[i] copies of grids[i], all on one grid step and
    one side (upper or lower bound), into one `ComposedGrid` with its error terms."""

    @property
    def name(self) -> str:
        """The engine's name in results and options ("dp_accounting", "fft")."""
        ...

    def compose(self, grids: Sequence[GridPLD], counts: Sequence[int]) -> ComposedGrid:
        """The composition of counts[i] copies of grids[i]."""
        ...


@dataclass(frozen=True)
class GridEngine:
    """A `CompositionEngine` from a compose function and the options it is always called with."""

    name: str
    compose_fn: Callable[..., ComposedGrid]  # (grids, counts, **options)
    options: dict[str, Any] = field(default_factory=dict)

    def compose(self, grids: Sequence[GridPLD], counts: Sequence[int]) -> ComposedGrid:
        return self.compose_fn(grids, counts, **self.options)


@dataclass(frozen=True)
class GridRounds:
    """An engine's validated input: the rounds with a count > 0, their common grid step and
    side, and the exact composition of their infinite masses (and of the truncated part)."""

    grids: list[GridPLD]
    counts: list[int]
    step: float
    upper: bool
    inf_mass: float
    log_inf_mass: float
    truncated_mass: float

    @property
    def total(self) -> int:
        """Number of rounds composed."""
        return sum(self.counts)


def grid_rounds(grids: Sequence[GridPLD], counts: Sequence[int]) -> GridRounds:
    """`GridRounds` of counts[i] copies of grids[i]; InvalidParameters unless they can be
    composed: one count per grid, counts >= 0 adding up to at least one round, one grid step
    and one side for all."""
    if not grids:
        raise InvalidParameters("nothing to compose: the list of PLDs is empty")
    if len(grids) != len(counts):
        raise InvalidParameters(f"{len(grids)} PLDs but {len(counts)} counts")
    cs = [int(c) for c in counts]
    if any(c < 0 for c in cs) or sum(cs) < 1:
        raise InvalidParameters("counts must be >= 0 with at least one round")
    step, upper = grids[0].step, grids[0].upper
    if any(g.step != step for g in grids):
        raise InvalidParameters("all gridded PLDs must share one grid step")
    if any(g.upper != upper for g in grids):
        raise InvalidParameters("cannot mix upper-bound and lower-bound PLDs in one composition")
    kept = [(g, c) for g, c in zip(grids, cs, strict=True) if c > 0]
    gs, ks = [g for g, _ in kept], [c for _, c in kept]
    inf_mass, log_inf = compose_inf_mass(gs, ks, upper)
    truncated = float(sum(c * g.truncated_mass for g, c in kept))
    return GridRounds(gs, ks, step, upper, inf_mass, log_inf, truncated)


def fp_error_estimate(vector_l2: float, output_l2: float, ops: float, m: int) -> float:
    """Round-off estimate, in delta units, of FFT-based convolution (both engines use it).

    With kappa = 8 u log2(m) (Higham, Accuracy and Stability, Thm 24.2: the 2-norm relative
    error of a computed FFT is about log2(m) * 7u), the output vector of a product-of-transforms
    convolution has a 2-norm error of about
        kappa * (sum of the 2-norms of the transformed vectors, with multiplicity)
        + u * (number of multiplications per frequency) + kappa * ||output||_2.
    A delta is a weighted sum of the output with weights in [0, 1]; under the usual model of
    independent round-off its error is of the order of that 2-norm. We return 4x it. This is an
    ESTIMATE, not a proof (the worst case is sqrt(m) times larger); in the tests the measured
    error of every delta was 50-1000x below it.
    """
    lg = max(1.0, math.log2(max(m, 2)))
    kappa = 8.0 * _U * lg
    return 4.0 * (kappa * (vector_l2 + output_l2) + _U * (ops + 1.0))
