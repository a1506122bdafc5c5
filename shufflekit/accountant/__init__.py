"""Privacy maths of shufflekit: shuffled k-RR bounds, composition, calibration, budget ledger.

A pure library (no I/O but the ledger), usable on its own: `from accountant import ...`.
"""

from shufflekit.accountant.core import Mechanism, PrivacyLossDistribution, PrivacyResult, Soundness
from shufflekit.base.errors import (
    AccountantError,
    AccuracyError,
    BudgetExceeded,
    InvalidParameters,
    LedgerError,
    NotApplicable,
)

__all__ = [
    "AccountantError",
    "AccuracyError",
    "BudgetExceeded",
    "InvalidParameters",
    "LedgerError",
    "Mechanism",
    "NotApplicable",
    "PrivacyLossDistribution",
    "PrivacyResult",
    "Soundness",
]
