"""The analyzer: decrypt the shuffled batch, validate, aggregate, denoise, release."""

from shufflekit.analyzer.estimators import ESTIMATORS, Estimate, estimate
from shufflekit.analyzer.service import Analyzer, AnalyzerOutcome

__all__ = ["ESTIMATORS", "Analyzer", "AnalyzerOutcome", "Estimate", "estimate"]
