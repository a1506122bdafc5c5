"""Counters of accepted and rejected inputs, by reason: what every service reports."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable


class RejectionCounter:
    """Accepted count plus rejections keyed by reason (`undecryptable`, `duplicate`, ...)."""

    def __init__(self, on_reject: Callable[[str], None] | None = None) -> None:
        self.accepted = 0
        self.rejected: Counter[str] = Counter()
        self.on_reject = on_reject  # e.g. a service's metrics, told of each rejection

    def accept(self) -> None:
        """Count one accepted input."""
        self.accepted += 1

    def reject(self, reason: str) -> None:
        """Count one rejected input under `reason`."""
        self.rejected[reason] += 1
        if self.on_reject is not None:
            self.on_reject(reason)

    def as_dict(self) -> dict[str, int]:
        """Rejections as a plain dict (for JSON)."""
        return dict(sorted(self.rejected.items()))
