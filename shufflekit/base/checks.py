"""The two checks every public entry point makes of a number it is given: a whole number (a
count, k, L, n_min) or a real one (eps0, epsilon, delta, seconds), each within its range.

One place, so that every layer takes numpy scalars, refuses a bool, a string, a float where a
count goes and NaN alike, and says so in one line naming the parameter, with the caller's
error class (InvalidParameters in the accountant, InvalidInput elsewhere).
"""

from __future__ import annotations

import math
import numbers
import operator

from shufflekit.base.errors import InvalidInput


def _range(
    low: float | None, high: float | None, fmt: str, low_open: bool = False, high_open: bool = False
) -> str:
    """' in [low, high]', ' >= low', ' <= high' or nothing, numbers written with `fmt`."""
    if low is not None and high is not None:
        return f" in {'(' if low_open else '['}{low:{fmt}}, {high:{fmt}}{')' if high_open else ']'}"
    if low is not None:
        return f" {'>' if low_open else '>='} {low:{fmt}}"
    return "" if high is None else f" {'<' if high_open else '<='} {high:{fmt}}"


def whole(
    name: str,
    value: object,
    low: int | None = None,
    high: int | None = None,
    error: type[InvalidInput] = InvalidInput,
) -> int:
    """`value` as an int (Python or numpy integer) in [low, high]; `error` otherwise: a bool,
    a float (even 3.0), a string or a number out of range."""
    try:
        if isinstance(value, bool):
            raise TypeError
        n = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        within = _range(low, high, "d")
        raise error(f"{name} must be a whole number{within}, got {value!r}") from None
    if (low is not None and n < low) or (high is not None and n > high):
        raise error(f"{name} must be a whole number{_range(low, high, 'd')}, got {n}")
    return n


def real(
    name: str,
    value: object,
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
    high_open: bool = False,
    error: type[InvalidInput] = InvalidInput,
) -> float:
    """`value` as a finite float (Python or numpy number) in its range (`low_open`: > low,
    `high_open`: < high);
    `error` otherwise: a bool, a string, None, NaN, an infinity or a number out of range."""
    within = _range(low, high, "g", low_open, high_open)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise error(f"{name} must be a finite number{within}, got {value!r}")
    x = float(value)
    if (
        not math.isfinite(x)
        or (low is not None and (x < low or (low_open and x == low)))
        or (high is not None and (x > high or (high_open and x == high)))
    ):
        raise error(f"{name} must be a finite number{within}, got {x!r}")  # all its digits
    return x
