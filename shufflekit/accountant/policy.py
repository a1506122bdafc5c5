"""Cost models: how the ledger turns recorded rounds into a total (epsilon, delta), so a budget
is enforced with a declared, sound composition.

The ledger never sums what a model did not promise to be summable: it hands the model the
whole list of rounds and asks for the composed epsilon at the budget's delta.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from shufflekit.accountant.composition import ENGINES, PldFn, compose_rounds
from shufflekit.accountant.core import Mechanism
from shufflekit.accountant.tight import tight_epsilon
from shufflekit.base.errors import InvalidParameters


class CostModel(Protocol):
    """Composed epsilon (an upper bound) of a list of rounds at a target delta."""

    name: str

    def total_epsilon(self, rounds: Sequence[Mechanism], delta: float) -> float:
        """Upper bound on the epsilon of running all `rounds` (delta in (0, 1))."""
        ...


class LdpSumCost:
    """Each round costs (eps0, 0) by the local guarantee alone; pure DP composes by summation.

    Sound whatever the shuffle does, and loose: the shuffle's amplification is ignored.
    """

    name = "ldp"

    def total_epsilon(self, rounds: Sequence[Mechanism], delta: float) -> float:
        return float(sum(r.eps0 for r in rounds))


class TightCost:
    """The default: the rounds' tight dominating pairs (`accountant.tight_upper.tight_pld`),
    composed by `accountant.composition`, and never above the LDP sum (both are sound upper
    bounds at the same delta, so their minimum is one too). One round alone is evaluated
    exactly, without the composition grid. `shufflekit privacy epsilon --rounds R` calls this
    same function, so the ledger and the CLI agree on the same rounds."""

    name = "tight"

    def total_epsilon(self, rounds: Sequence[Mechanism], delta: float) -> float:
        if not rounds:
            return 0.0
        ldp_sum = LdpSumCost().total_epsilon(rounds, delta)
        if len(rounds) == 1:
            return min(float(tight_epsilon(rounds[0], delta).epsilon), ldp_sum)
        return min(float(compose_rounds(rounds).epsilon(delta)), ldp_sum)


class PldCost:
    """The composed PLD upper bound of all recorded rounds (`pld_fn`, default `tight_pld`, on a
    chosen engine and grid), without the LDP cap or the exact single round of `TightCost`."""

    def __init__(
        self,
        pld_fn: PldFn | None = None,
        *,
        engine: str = "dp_accounting",
        grid: float | None = None,
    ) -> None:
        if engine not in ENGINES:
            raise InvalidParameters(f"engine must be one of {ENGINES}, got {engine!r}")
        self.pld_fn = pld_fn
        self.engine = engine
        self.grid = grid
        self.name = f"pld-{engine}"

    def total_epsilon(self, rounds: Sequence[Mechanism], delta: float) -> float:
        if not rounds:
            return 0.0
        return compose_rounds(
            rounds, pld_fn=self.pld_fn, engine=self.engine, grid=self.grid
        ).epsilon(delta)


COST_MODELS: dict[str, CostModel] = {"tight": TightCost(), "ldp": LdpSumCost()}


def cost_model(name: str) -> CostModel:
    """The cost model a budget names; InvalidParameters listing the valid names otherwise."""
    try:
        return COST_MODELS[name]
    except KeyError:
        raise InvalidParameters(
            f"unknown cost model {name!r}; choose one of {sorted(COST_MODELS)}"
        ) from None
