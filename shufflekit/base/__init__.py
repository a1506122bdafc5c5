"""The bottom layer: the error tree, and the clock and randomness every layer above is handed.

Tiny and free of I/O, so that everything (the accountant and its ledger included) can import it.
"""

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
