"""shufflekit's privacy accountant: sound, tight (epsilon, delta) of shuffled k-RR rounds, their
composition, calibration, and the budget ledger. A pure library (no I/O but the ledger):

    from shufflekit.accountant import Mechanism, tight_epsilon, tight_delta, compose_rounds
    from shufflekit.accountant import calibrate_eps0, leakage_report, Ledger, Budget

    mech = Mechanism(n=100_000, k=10, eps0=4.0)
    tight_epsilon(mech, 1e-6).epsilon               # one round: sound upper bound ...
    tight_epsilon(mech, 1e-6).lower_epsilon         # ... and the best attack below it
    tight_delta(mech, 0.5).delta                    # delta at an epsilon (log_delta: no underflow)
    compose_rounds([mech, Mechanism(50_000, 4, 2.0)]).epsilon(1e-6)  # R rounds, any mix
    calibrate_eps0(n=10_000, k=10, rounds=3, epsilon=1.0, delta=1e-6)  # largest eps0 that fits
    leakage_report(n=10_000, k=10, eps0=2.0).outsider_vulnerability  # QIF: guess one's value
    ledger = Ledger("sqlite:///ledger.db")          # reserve / commit / refund against a Budget

Every other bound (blanket, clones, closed forms, Biswas et al., LDP) is in
`accountant.registry`; errors are the `shufflekit.base.errors` classes re-exported here.

The names load on first use (PEP 562 `__getattr__`): importing the package costs nothing, so a
program that needs one of them (the command line's `--help`, say) does not pay for the
calibration, the composition engines (scipy, dp_accounting) and the ledger (SQLAlchemy) too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shufflekit.base.lazy import lazy_exports

if TYPE_CHECKING:  # the names and their modules: loaded on first use (`base.lazy`)
    from shufflekit.accountant.calibrate import calibrate_eps0
    from shufflekit.accountant.composition import compose_rounds
    from shufflekit.accountant.core import (
        Mechanism,
        PrivacyLossDistribution,
        PrivacyResult,
        Soundness,
    )
    from shufflekit.accountant.leakage import (
        Leakage,
        leakage_report,
        min_cohort,
        participant_statement,
    )
    from shufflekit.accountant.ledger import Budget, Ledger
    from shufflekit.accountant.tight import tight_delta, tight_epsilon
    from shufflekit.base.errors import (
        AccountantError,
        AccuracyError,
        BudgetExceeded,
        InvalidParameters,
        LedgerBusy,
        LedgerDamaged,
        LedgerError,
        LedgerNotFound,
        LedgerReadOnly,
        LedgerUnavailable,
        LedgerUpgraded,
        NotApplicable,
        ScheduleViolation,
        StaleQuote,
        UnsoundResult,
    )

__all__ = [
    "AccountantError",
    "AccuracyError",
    "Budget",
    "BudgetExceeded",
    "InvalidParameters",
    "Leakage",
    "Ledger",
    "LedgerBusy",
    "LedgerDamaged",
    "LedgerError",
    "LedgerNotFound",
    "LedgerReadOnly",
    "LedgerUnavailable",
    "LedgerUpgraded",
    "Mechanism",
    "NotApplicable",
    "PrivacyLossDistribution",
    "PrivacyResult",
    "ScheduleViolation",
    "Soundness",
    "StaleQuote",
    "UnsoundResult",
    "calibrate_eps0",
    "compose_rounds",
    "leakage_report",
    "min_cohort",
    "participant_statement",
    "tight_delta",
    "tight_epsilon",
]

if not TYPE_CHECKING:  # the type checker sees the imports above, and no catch-all
    __getattr__, __dir__ = lazy_exports(__name__)
