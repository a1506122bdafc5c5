"""The one error tree: every error shufflekit raises on purpose derives from `ShufflekitError`.

Two branches say who can act on it. A `UserError` is about what the user asked or the world
they pointed us at (bad input, a refused budget, an unreachable broker): the CLI prints its
message on one line and exits 2. An `InternalError` is a broken promise of our own (an upper
bound below its lower bound, an invariant violated): the CLI says it is a bug and exits 70.
Each layer adds its own classes under these two (see `shufflekit.base.errors`).
"""

from __future__ import annotations

import shlex


class ShufflekitError(Exception):
    """The root of every error shufflekit raises on purpose."""

    exit_code = 2


class UserError(ShufflekitError):
    """Something the user can fix: the message says what is wrong and what to do."""


class InvalidInput(UserError, ValueError):
    """A value given by a user, a file or a peer is out of range or malformed."""


class Unavailable(UserError):
    """Something the user pointed us at cannot be reached or opened (broker, database, file)."""


class InternalError(ShufflekitError):
    """A bug: an invariant of shufflekit itself does not hold. Never caused by input alone."""

    exit_code = 70


class InvalidReport(InvalidInput):
    """A report, envelope, batch or control message failed validation.

    `reason` is the counter it is filed under at the hop that sees it.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class TransportError(Unavailable):
    """The transport (in-memory bus or MQTT broker) could not deliver or connect."""


class SpoolError(Unavailable):
    """A hop's spool cannot be opened, read or written (disk full, unwritable, corrupted)."""


class RoundAborted(UserError):
    """A round released nothing (too few reports, a broken batch); its reserved cost is refunded."""


class RoundSuspended(UserError):
    """A service stopped while one of its rounds waited for input: the round stays in its spool
    and the next start resumes it, as after a crash (what its clients were receipted for is
    kept); a hop that never comes back leaves the coordinator to abort and refund it."""


class ConfigError(InvalidInput):
    """A command-line or configuration value is invalid."""


class BrokerTLSError(TransportError):
    """The TLS handshake with the broker failed (untrusted certificate, wrong host, not TLS)."""


class BrokerAuthError(TransportError):
    """The broker refused the login: unknown user, wrong password or no credentials."""


class BrokerAccessDenied(TransportError):
    """The broker's ACL refused a publish or a subscription for this account."""

    def __init__(self, message: str, topic: str) -> None:
        super().__init__(message)
        self.topic = topic


class InvalidKey(InvalidInput):
    """A key given as text (base64 of its 32 raw bytes, in a key file or announcement) is bad."""


class EstimatorInputError(InvalidInput):
    """An estimator was given an invalid histogram or parameter; the message says which."""


class MetricInputError(InvalidInput):
    """The two vectors cannot be compared (shape mismatch or non-finite entries)."""


class CalibrationError(InvalidInput):
    """No Gaussian noise level satisfies the requested (epsilon, delta) (or inputs are invalid)."""


class AccountantError(ShufflekitError):
    """Raised by `shufflekit.accountant`; every concrete one is also a user or internal error."""


class InvalidParameters(AccountantError, InvalidInput):
    """A mechanism or query parameter is out of range (n < 1, k < 2, eps0 <= 0, ...)."""


class NotApplicable(AccountantError, UserError):
    """A bound is not defined for these parameters (outside the validity range of its theorem)."""


class AccuracyError(AccountantError, UserError):
    """The answer cannot be computed to the requested accuracy; the message says why."""


class BudgetExceeded(AccountantError, UserError):
    """A round would take the total privacy loss past the deployment's budget."""


class ScheduleViolation(BudgetExceeded):
    """A round refused by its planned budget: its type is not the one the schedule fixed for
    its slot, or the schedule has no slot left."""


class LedgerError(AccountantError, Unavailable):
    """The ledger cannot be opened, read or written (wrong URL, foreign or corrupt database)."""


class LedgerBusy(LedgerError):
    """The ledger's database is busy (locked by another writer): transient, worth retrying."""


class LedgerUnavailable(LedgerError):
    """The ledger's database cannot be reached (connection refused, or lost mid-call): a
    service retries it like a busy one; a write whose reply was lost may have landed."""


class LedgerReadOnly(LedgerError):
    """The ledger refuses this process's writes (a read-only file or folder, a PostgreSQL role
    without write privilege, a read-only transaction): not transient, so nobody retries it;
    reading it still works where the database allows."""


class LedgerDamaged(LedgerError):
    """The ledger's database is damaged (not a database, or its integrity check fails): it is
    refused, not retried, and nothing more is written to it; restore it from a backup."""


class RoleHeld(LedgerError):
    """Another live process holds the role's lease for the deployment (a second coordinator
    started while the first runs): this one does not start, or stops."""


class LedgerUpgraded(LedgerError):
    """A newer shufflekit brought the ledger's schema forward while this process had it open:
    its writes are refused (its rules may be stale), and a service stops."""


class StaleQuote(LedgerBusy):
    """A round's result was priced before another round was committed: price it again."""


class LedgerNotFound(LedgerError):
    """`Ledger(url, create=False)` found no ledger there (no such file, or an empty database)."""

    def __init__(
        self, where: str, deployment: str | None = None, ledger_option: str | None = None
    ) -> None:
        whose = f", so deployment {deployment!r} has no budget" if deployment else ""
        opt = f" --ledger {ledger_option}" if ledger_option else ""
        opt += f" --deployment {shlex.quote(deployment)}" if deployment else ""
        super().__init__(
            f"no ledger at {where}{whose}; create one with "
            f"`shufflekit budget init{opt} --epsilon E --delta D`"
        )
        self.where = where


class UnsoundResult(AccountantError, InternalError):
    """A computed bound contradicts its own certificate (e.g. an upper bound below the lower)."""


__all__ = [
    "AccountantError",
    "AccuracyError",
    "BrokerAccessDenied",
    "BrokerAuthError",
    "BrokerTLSError",
    "BudgetExceeded",
    "CalibrationError",
    "ConfigError",
    "EstimatorInputError",
    "InternalError",
    "InvalidInput",
    "InvalidKey",
    "InvalidParameters",
    "InvalidReport",
    "LedgerBusy",
    "LedgerDamaged",
    "LedgerError",
    "LedgerNotFound",
    "LedgerReadOnly",
    "LedgerUnavailable",
    "LedgerUpgraded",
    "MetricInputError",
    "NotApplicable",
    "RoleHeld",
    "RoundAborted",
    "RoundSuspended",
    "ScheduleViolation",
    "ShufflekitError",
    "SpoolError",
    "StaleQuote",
    "TransportError",
    "Unavailable",
    "UnsoundResult",
    "UserError",
]
