"""A package's public names, loaded on first use (PEP 562) from the modules its
`if TYPE_CHECKING:` block imports them from.

Importing such a package costs nothing, so the command line's `--help` does not load the
accountant's engines (scipy, dp_accounting), the ledger (SQLAlchemy) or the agent's MQTT to
read a few names. The TYPE_CHECKING block is the one list of what comes from where: the type
checker and the import linter read it (the layers contract still sees every edge), and
`lazy_exports` reads it from the package's source, so a name and its module cannot disagree.
"""

from __future__ import annotations

import ast
import importlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shufflekit.base.errors import InternalError


def lazy_exports(package: str) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """`__getattr__` and `__dir__` for `package` (its `__init__`'s `__name__`): each name of
    its `__all__` comes, on first use, from the module its TYPE_CHECKING block names, and
    is then kept in the package as an eager import would have put it."""
    module = sys.modules[package]
    homes = type_checking_imports(Path(str(module.__file__)).read_text())
    namespace = vars(module)
    exported = set(namespace.get("__all__", ()))
    if exported != set(homes):
        raise InternalError(f"{package}: __all__ and its TYPE_CHECKING imports differ")

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:  # a submodule not imported yet, or a typo
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | exported)

    return __getattr__, __dir__


def type_checking_imports(source: str) -> dict[str, str]:
    """Each name a module's top-level `if TYPE_CHECKING:` block imports -> its module
    (`from a.b import c, d` only: anything else there is an InternalError)."""
    homes: dict[str, str] = {}
    for node in ast.parse(source).body:
        if not (isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"):
            continue
        for stmt in node.body:
            if not isinstance(stmt, ast.ImportFrom) or stmt.level or stmt.module is None:
                raise InternalError(f"not an absolute `from ... import`: {ast.unparse(stmt)}")
            for alias in stmt.names:
                homes[alias.asname or alias.name] = stmt.module
    return homes
