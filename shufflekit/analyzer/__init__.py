"""The analyzer: decrypt the shuffled batch, validate, aggregate, denoise, release.

The names load on first use (PEP 562 `__getattr__`), so importing `analyzer.names` (what the
command line's `--help` needs) does not load the estimators' numerics and the service too.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what the type checker sees; at run time __getattr__ imports each on first use
    from shufflekit.analyzer.estimators import Estimate, estimate
    from shufflekit.analyzer.names import ESTIMATORS
    from shufflekit.analyzer.service import Analyzer, AnalyzerOutcome

#: Each public name and its module (the `if TYPE_CHECKING` imports above, again); `_module`
#: imports it.
_HOME = {
    "ESTIMATORS": "names",
    "Estimate": "estimators",
    "estimate": "estimators",
    "Analyzer": "service",
    "AnalyzerOutcome": "service",
}

__all__ = ["ESTIMATORS", "Analyzer", "AnalyzerOutcome", "Estimate", "estimate"]


def __getattr__(name: str) -> Any:
    """Import a public name's module on first use and keep the name here (PEP 562)."""
    home = _HOME.get(name)
    if home is None:  # a submodule (`from shufflekit.analyzer import service`) or a typo
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_module(home), name)
    globals()[name] = value
    return value


def _module(home: str) -> ModuleType:
    """The module `home` names, by a plain import (one the import linter sees)."""
    match home:
        case "names":
            from shufflekit.analyzer import names

            return names
        case "estimators":
            from shufflekit.analyzer import estimators

            return estimators
        case _:
            from shufflekit.analyzer import service

            return service


def __dir__() -> list[str]:
    """The public names as well as what is loaded, as `dir()` listed them when eager."""
    return sorted(set(globals()) | set(__all__))
