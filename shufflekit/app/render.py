"""Output helpers shared by CLI commands: JSON for scripts, rich tables for people.

Both consoles print text literally: Rich markup is off (a deployment `a[/b]`, a `[mix]` in a
message or `mqtt[s]` in a URL is printed as given), and styling is explicit (`styled`). On a
terminal tables fit its width; piped or redirected they are printed at full width, never cut.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
from collections.abc import Callable, Iterator
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

PIPE_WIDTH = 10_000
"""Width of a console that is not a terminal: wide enough that no table or line is cut."""


class _Console(Console):
    """Rich's console, except that a closed pipe is an error the CLI's handler sees: Rich's own
    reaction, SystemExit(1), would pass it by and `... | head` would exit 1, not 141."""

    def on_broken_pipe(self) -> None:
        self.quiet = True  # nothing more to write to a reader that has gone
        raise BrokenPipeError


def _console(stderr: bool = False) -> Console:
    """A console that never interprets markup; full width when not on a terminal."""
    con = _Console(stderr=stderr, markup=False, highlight=False)
    if not con.is_terminal:
        con.width = PIPE_WIDTH
    return con


console = _console()
err_console = _console(stderr=True)


def styled(*parts: str | Text | tuple[str, str]) -> Text:
    """Text from literal pieces: a str or Text as is, a (text, style) pair styled (e.g. bold)."""
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
