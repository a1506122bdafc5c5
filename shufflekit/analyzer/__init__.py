"""The analyzer: decrypt the shuffled batch, validate, aggregate, denoise, release.

The names load on first use (PEP 562 `__getattr__`), so importing `analyzer.names` (what the
command line's `--help` needs) does not load the estimators' numerics and the service too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shufflekit.base.lazy import lazy_exports

if TYPE_CHECKING:  # the names and their modules: loaded on first use (`base.lazy`)
    from shufflekit.analyzer.estimators import Estimate, estimate
    from shufflekit.analyzer.names import ESTIMATORS
    from shufflekit.analyzer.service import Analyzer, AnalyzerOutcome

__all__ = ["ESTIMATORS", "Analyzer", "AnalyzerOutcome", "Estimate", "estimate"]

if not TYPE_CHECKING:  # the type checker sees the imports above, and no catch-all
    __getattr__, __dir__ = lazy_exports(__name__)
