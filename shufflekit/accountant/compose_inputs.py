"""The rounds and counts a composition is asked for, checked once at the entry points
(`composition.compose`, `compose_rounds`, `rounds_epsilon`, `compose_rounds_bounds`), so that a
float, a bool, a bare number or a string where a list of counts goes is an InvalidParameters
naming it, never a count silently truncated (2.9 rounds composed as 2) or a raw TypeError."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

from shufflekit.accountant.core import Mechanism, mechanisms
from shufflekit.base.checks import whole
from shufflekit.base.errors import InvalidParameters


def check_counts(counts: Iterable[int] | None, n: int, what: str) -> list[int]:
    """counts as ints (default one each): one per item, whole numbers >= 0 adding up to >= 1."""
    if counts is None:
        return [1] * n
    if isinstance(counts, str | bytes) or not isinstance(counts, Iterable):
        raise InvalidParameters(
            f"counts must be a list of whole numbers, one per item of the {n} {what}, "
            f"got {counts!r}"
        )
    cs = [whole("counts", c, 0, error=InvalidParameters) for c in counts]
    if len(cs) != n:
        raise InvalidParameters(f"{n} {what} but {len(cs)} counts")
    if sum(cs) < 1:
        raise InvalidParameters("counts must add up to at least one round")
    return cs


def rounds_and_counts(
    rounds: Iterable[Mechanism], counts: Iterable[int] | None
) -> tuple[list[Mechanism], list[int]]:
    """`rounds` as a non-empty list of Mechanism and their counts (`check_counts`)."""
    rs = mechanisms(rounds)
    if not rs:
        raise InvalidParameters("nothing to compose: no rounds")
    return rs, check_counts(counts, len(rs), "rounds")


def group_rounds(
    rounds: Sequence[Mechanism], counts: Sequence[int]
) -> OrderedDict[tuple[int, int, float], int]:
    """Total count of each distinct mechanism, keyed (n, k, eps0), in first-seen order, of
    rounds and counts as `rounds_and_counts` returned them."""
    grouped: OrderedDict[tuple[int, int, float], int] = OrderedDict()
    for m, c in zip(rounds, counts, strict=True):
        key = (int(m.n), int(m.k), float(m.eps0))
        grouped[key] = grouped.get(key, 0) + c
    return grouped
