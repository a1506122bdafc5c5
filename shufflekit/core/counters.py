"""Counters of accepted and rejected inputs, by reason: what every service reports."""

from __future__ import annotations

from collections import Counter


class RejectionCounter:
    """Accepted count plus rejections keyed by reason (`undecryptable`, `duplicate`, ...)."""

    def __init__(self) -> None:
        self.accepted = 0
        self.rejected: Counter[str] = Counter()

    def accept(self) -> None:
        """Count one accepted input."""
        self.accepted += 1

    def reject(self, reason: str) -> None:
        """Count one rejected input under `reason`."""
        self.rejected[reason] += 1

    def as_dict(self) -> dict[str, int]:
        """Rejections as a plain dict (for JSON)."""
        return dict(sorted(self.rejected.items()))
