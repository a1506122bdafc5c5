"""Output helpers shared by CLI commands: JSON for scripts, rich tables for people."""

from __future__ import annotations

import json
import math
import sys
from typing import Any

from rich.console import Console

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


def fail(message: str, code: int = 2) -> None:
    """Print an error a user can act on, and exit non-zero."""
    err_console.print(f"[bold red]error:[/] {message}", highlight=False)
    raise SystemExit(code)
