"""A simulated population: many client agents answering a round over one connection.

Used by the demo and for load testing. Publishing is bounded by the transport's in-flight
limit; progress is reported through an optional callback. One injected `Randomness` (default:
the OS CSPRNG) serves every agent, so a seeded one makes the whole population replayable.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from shufflekit.base.checks import whole
from shufflekit.base.errors import InvalidInput
from shufflekit.base.random import Randomness, SystemRandomness
from shufflekit.client.agent import ClientAgent
from shufflekit.core.messages import Announcement
from shufflekit.core.transport.base import Transport


class Population:
    """`values[i]` is the private value of simulated user i; `rng` draws their responses."""

    def __init__(
        self, values: Sequence[int], id_prefix: str = "user", *, rng: Randomness | None = None
    ) -> None:
        if isinstance(values, str | bytes) or not isinstance(values, Iterable):
            raise InvalidInput(f"values must be a list of whole numbers, got {values!r}")
        self.rng: Randomness = rng if rng is not None else SystemRandomness()
        self.agents = [
            ClientAgent(f"{id_prefix}-{i}", whole(f"value of user {i}", v, 0), rng=self.rng)
            for i, v in enumerate(values)
        ]  # whole numbers only: 1.5 was answered as 1

    def check_fits(self, k: int) -> None:
        """InvalidInput unless every value is in [0, k): before a round is reserved, so that a
        population that cannot answer it never leaves a reservation behind."""
        top = max((a.value for a in self.agents), default=0)
        if top >= k:
            raise InvalidInput(f"values must lie in [0, {k}) for this round, got {top}")

    def __len__(self) -> int:
        return len(self.agents)

    async def answer(
        self,
        transport: Transport,
        ann: Announcement,
        progress: Callable[[int], None] | None = None,
    ) -> int:
        """Every agent answers the round; returns how many reports were sent."""
        for i, agent in enumerate(self.agents, 1):
            await agent.answer(transport, ann)
            if progress is not None and (i % 1000 == 0 or i == len(self.agents)):
                progress(i)
        return len(self.agents)
