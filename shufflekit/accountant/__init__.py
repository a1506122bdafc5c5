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

from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what the type checker sees; at run time __getattr__ imports each on first use
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
        LedgerError,
        LedgerNotFound,
        LedgerUnavailable,
        LedgerUpgraded,
        NotApplicable,
        ScheduleViolation,
        StaleQuote,
        UnsoundResult,
    )

#: Each public name and its module (the `if TYPE_CHECKING` imports above, again); `_module`
#: imports it.
_HOME = {
    "calibrate_eps0": "calibrate",
    "compose_rounds": "composition",
    **dict.fromkeys(
        ("Mechanism", "PrivacyLossDistribution", "PrivacyResult", "Soundness"),
        "core",
    ),
    **dict.fromkeys(
        ("Leakage", "leakage_report", "min_cohort", "participant_statement"),
        "leakage",
    ),
    **dict.fromkeys(("Budget", "Ledger"), "ledger"),
    **dict.fromkeys(("tight_delta", "tight_epsilon"), "tight"),
    **dict.fromkeys(
        (
            "AccountantError",
            "AccuracyError",
            "BudgetExceeded",
            "InvalidParameters",
            "LedgerBusy",
            "LedgerError",
            "LedgerNotFound",
            "LedgerUnavailable",
            "LedgerUpgraded",
            "NotApplicable",
            "ScheduleViolation",
            "StaleQuote",
            "UnsoundResult",
        ),
        "errors",
    ),
}

__all__ = [
    "AccountantError",
    "AccuracyError",
    "Budget",
    "BudgetExceeded",
    "InvalidParameters",
    "Leakage",
    "Ledger",
    "LedgerBusy",
    "LedgerError",
    "LedgerNotFound",
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


def __getattr__(name: str) -> Any:
    """Import a public name's module on first use and keep the name here (PEP 562)."""
    home = _HOME.get(name)
    if home is None:  # a submodule (`from shufflekit.accountant import tight`) or a typo
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_module(home), name)
    globals()[name] = value
    return value


def _module(home: str) -> ModuleType:
    """The module `home` names, by a plain import (one the import linter sees)."""
    match home:
        case "calibrate":
            from shufflekit.accountant import calibrate

            return calibrate
        case "composition":
            from shufflekit.accountant import composition

            return composition
        case "core":
            from shufflekit.accountant import core

            return core
        case "leakage":
            from shufflekit.accountant import leakage

            return leakage
        case "ledger":
            from shufflekit.accountant import ledger

            return ledger
        case "tight":
            from shufflekit.accountant import tight

            return tight
        case _:
            from shufflekit.base import errors

            return errors


def __dir__() -> list[str]:
    """The public names as well as what is loaded, as `dir()` listed them when eager."""
    return sorted(set(globals()) | set(__all__))
