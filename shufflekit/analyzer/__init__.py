"""The analyzer: decrypt the shuffled batch, validate, aggregate, denoise, release."""

from shufflekit.analyzer.service import Analyzer, AnalyzerOutcome

__all__ = ["Analyzer", "AnalyzerOutcome"]
