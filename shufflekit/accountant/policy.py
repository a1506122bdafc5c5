"""Cost models: how the ledger turns recorded rounds into a total (epsilon, delta).

The ledger never sums what a model did not promise to be summable: it hands the model the
whole list of rounds and asks for the composed epsilon at the budget's delta.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Protocol

from shufflekit.accountant.core import Mechanism
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
    """The default: the rounds' tight dominating pairs (`accountant.tight`), composed by
    `accountant.composition`, and never above the LDP sum (both are sound upper bounds at the
    same delta, so their minimum is one too). One round alone is evaluated exactly, without
    the composition grid. `shufflekit privacy epsilon --rounds R` calls this same function, so
    the ledger and the CLI agree on the same rounds."""

    name = "tight"

    def total_epsilon(self, rounds: Sequence[Mechanism], delta: float) -> float:
        if not rounds:
            return 0.0
        ldp_sum = LdpSumCost().total_epsilon(rounds, delta)
        if len(rounds) == 1:
            tight = importlib.import_module("shufflekit.accountant.tight")
            return min(float(tight.tight_epsilon(rounds[0], delta).epsilon), ldp_sum)
        composition = importlib.import_module("shufflekit.accountant.composition")
        return min(float(composition.compose_rounds(rounds).epsilon(delta)), ldp_sum)


COST_MODELS: dict[str, CostModel] = {"tight": TightCost(), "ldp": LdpSumCost()}


def cost_model(name: str) -> CostModel:
    """The cost model a budget names; InvalidParameters listing the valid names otherwise."""
    try:
        return COST_MODELS[name]
    except KeyError:
        raise InvalidParameters(
            f"unknown cost model {name!r}; choose one of {sorted(COST_MODELS)}"
        ) from None
