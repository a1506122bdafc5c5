"""The bottom layer: the error tree, and the clock and randomness every layer above is handed.

Tiny and free of I/O, so that everything (the accountant and its ledger included) can import it.
The names load on first use (PEP 562 `__getattr__`): a module that needs only `base.errors` or
`base.checks` (the command line's option declarations) does not load asyncio for the clock.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shufflekit.base.lazy import lazy_exports

if TYPE_CHECKING:  # the names and their modules: loaded on first use (`base.lazy`)
    from shufflekit.base.clock import Clock, SystemClock, system_clock
    from shufflekit.base.errors import (
        InternalError,
        InvalidInput,
        ShufflekitError,
        Unavailable,
        UserError,
    )
    from shufflekit.base.random import Randomness, SeededRandomness, SystemRandomness

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

if not TYPE_CHECKING:  # the type checker sees the imports above, and no catch-all
    __getattr__, __dir__ = lazy_exports(__name__)
