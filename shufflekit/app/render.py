"""Output helpers shared by CLI commands: JSON for scripts, rich tables for people.

Both consoles print text literally: Rich markup is off (a deployment `a[/b]`, a `[mix]` in a
message or `mqtt[s]` in a URL is printed as given), and styling is explicit (`styled`). On a
terminal tables fit its width; piped or redirected they are printed at full width, never cut.

Rich is imported when first used (`console` and `err_console` are made on first access, PEP 562),
not with this module: `shufflekit --version` has nothing to print through it.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console
    from rich.text import Text

    console: Console  # made on first access by __getattr__ (below)
    err_console: Console

PIPE_WIDTH = 10_000
"""Width of a console that is not a terminal: wide enough that no table or line is cut."""


def _console(stderr: bool = False) -> Console:
    """A console that never interprets markup; full width when not on a terminal."""
    from rich.console import Console

    class _Console(Console):
        """Rich's console, except that a closed pipe is an error the CLI's handler sees: Rich's
        own reaction, SystemExit(1), would pass it by and `... | head` would exit 1, not 141."""

        def on_broken_pipe(self) -> None:
            self.quiet = True  # nothing more to write to a reader that has gone
            raise BrokenPipeError

    con = _Console(stderr=stderr, markup=False, highlight=False)
    if not con.is_terminal:
        con.width = PIPE_WIDTH
    return con


def _made(name: str) -> Console:
    """The module's `console` or `err_console`, made now if this is its first use."""
    if name not in globals():
        globals()[name] = _console(stderr=name == "err_console")
    made: Console = globals()[name]
    return made


if not TYPE_CHECKING:  # the type checker sees the two annotations above, and no catch-all

    def __getattr__(name: str) -> Any:
        """`console` (stdout) and `err_console` (stderr), each made once, on first access."""
        if name not in ("console", "err_console"):
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        return _made(name)


def styled(*parts: str | Text | tuple[str, str]) -> Text:
    """Text from literal pieces: a str or Text as is, a (text, style) pair styled (e.g. bold)."""
    from rich.text import Text

    return Text.assemble(*parts)


def _clean(x: Any) -> Any:
    """Make a value JSON-safe: NaN (not available) becomes null, an infinity the string "inf"
    or "-inf" (JSON has neither), numpy scalars plain numbers."""
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_clean(v) for v in x]
    if hasattr(x, "item") and callable(x.item):
        x = x.item()
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, float) and math.isinf(x):
        return str(x)
    return x


def print_json(obj: Any) -> None:
    """One JSON object on stdout."""
    sys.stdout.write(json.dumps(_clean(obj), indent=2) + "\n")


@contextlib.contextmanager
def progress_bar(
    description: str, total: int, unit: str = "", *, quiet: bool = False
) -> Iterator[Callable[..., None]]:
    """A progress bar on stderr while the block runs; yields `update(completed, description=)`.

    Shown only on a terminal and unless `quiet` (e.g. --json): piped output stays clean.
    """
    from rich.progress import (
        BarColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    err_console = _made("err_console")
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}" + (f" {unit}" if unit else "")),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=err_console,
        transient=True,
        disable=quiet or not err_console.is_terminal,
    ) as bar:
        task = bar.add_task(description, total=total)

        def update(
            completed: int, description: str | None = None, total: int | None = None
        ) -> None:
            bar.update(task, completed=completed, description=description, total=total)

        yield update


@contextlib.contextmanager
def working(description: str, *, quiet: bool = False) -> Iterator[None]:
    """A spinner with the elapsed time on stderr for work that cannot be counted (a search).

    Shown only on a terminal and unless `quiet` (e.g. --json), like `progress_bar`.
    """
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    err_console = _made("err_console")
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
        disable=quiet or not err_console.is_terminal,
    ) as bar:
        bar.add_task(description, total=None)
        yield
