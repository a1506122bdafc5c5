"""The bottom layer: the error tree, and the clock and randomness every layer above is handed.

Tiny and free of I/O, so that everything (the accountant and its ledger included) can import it.
The names load on first use (PEP 562 `__getattr__`): a module that needs only `base.errors` or
`base.checks` (the command line's option declarations) does not load asyncio for the clock.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what the type checker sees; at run time __getattr__ imports each on first use
    from shufflekit.base.clock import Clock, SystemClock, system_clock
    from shufflekit.base.errors import (
        InternalError,
        InvalidInput,
        ShufflekitError,
        Unavailable,
        UserError,
    )
    from shufflekit.base.random import Randomness, SeededRandomness, SystemRandomness

#: Each public name and its module (the `if TYPE_CHECKING` imports above, again); `_module`
#: imports it.
_HOME = {
    **dict.fromkeys(("Clock", "SystemClock", "system_clock"), "clock"),
    **dict.fromkeys(
        ("InternalError", "InvalidInput", "ShufflekitError", "Unavailable", "UserError"), "errors"
    ),
    **dict.fromkeys(("Randomness", "SeededRandomness", "SystemRandomness"), "random"),
}

__all__ = [
    "Clock",
    "InternalError",
    "InvalidInput",
    "Randomness",
    "SeededRandomness",
    "ShufflekitError",
    "SystemClock",
    "SystemRandomness",
    "Unavailable",
    "UserError",
    "system_clock",
]


def __getattr__(name: str) -> Any:
    """Import a public name's module on first use and keep the name here (PEP 562)."""
    home = _HOME.get(name)
    if home is None:  # a submodule (`from shufflekit.base import errors`) or a typo
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_module(home), name)
    globals()[name] = value
    return value


def _module(home: str) -> ModuleType:
    """The module `home` names, by a plain import (one the import linter sees)."""
    match home:
        case "clock":
            from shufflekit.base import clock

            return clock
        case "errors":
            from shufflekit.base import errors

            return errors
        case _:
            from shufflekit.base import random

            return random


def __dir__() -> list[str]:
    """The public names as well as what is loaded, as `dir()` listed them when eager."""
    return sorted(set(globals()) | set(__all__))
