"""Output helpers shared by CLI commands: JSON for scripts, rich tables for people."""

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
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

console = Console()
err_console = Console(stderr=True)


def _clean(x: Any) -> Any:
    """Make a value JSON-safe: non-finite floats become strings, numpy scalars plain numbers."""
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_clean(v) for v in x]
    if hasattr(x, "item") and callable(x.item):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
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

        def update(completed: int, description: str | None = None) -> None:
            bar.update(task, completed=completed, description=description)

        yield update
