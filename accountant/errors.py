"""Typed errors of the accountant: each carries a message a user can act on."""

from __future__ import annotations


class AccountantError(Exception):
    """Base class of every error raised by `accountant`."""


class InvalidParameters(AccountantError, ValueError):
    """A mechanism or query parameter is out of range (n < 1, k < 2, eps0 <= 0, ...)."""


class NotApplicable(AccountantError):
    """A bound is not defined for these parameters (outside the validity range of its theorem)."""


class AccuracyError(AccountantError):
    """The answer cannot be computed to the requested accuracy; the message says why."""


class BudgetExceeded(AccountantError):
    """A round would take the total privacy loss past the deployment's budget."""


class LedgerError(AccountantError):
    """The ledger cannot be opened, read or written (wrong URL, foreign or corrupt database)."""
