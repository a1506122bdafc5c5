"""Typed errors shared by every component; each message says what is wrong and what to do."""

from __future__ import annotations

from accountant.errors import BudgetExceeded, LedgerError


class ShufflekitError(Exception):
    """Base class of shufflekit's own errors (the accountant's errors have their own base)."""


class InvalidReport(ShufflekitError):
    """A report, envelope or batch failed validation; `reason` is the counter it is filed under."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class TransportError(ShufflekitError):
    """The transport (in-memory bus or MQTT broker) could not deliver or connect."""


class RoundAborted(ShufflekitError):
    """A round released nothing (too few reports, a broken batch); its reserved cost is refunded."""


class ConfigError(ShufflekitError):
    """A command-line or configuration value is invalid."""


__all__ = [
    "BudgetExceeded",
    "ConfigError",
    "InvalidReport",
    "LedgerError",
    "RoundAborted",
    "ShufflekitError",
    "TransportError",
]
