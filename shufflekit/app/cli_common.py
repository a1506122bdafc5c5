"""What every command shares: its common options and the one place errors become messages.

Every command raises; none prints its own error. `ShufflekitGroup.invoke` catches what comes
out of any command and turns it into one line on stderr and an exit code: 2 for a user error
(our `UserError` tree, an unreadable or unwritable file, memory), 70 for a bug, 130 on Ctrl-C.
`SHUFFLEKIT_DEBUG=1` adds the traceback.
"""

from __future__ import annotations

import inspect
import os
import sys
import traceback
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from typer.core import TyperGroup, TyperOption

from shufflekit.app import render
from shufflekit.base.checks import real
from shufflekit.base.errors import InternalError, InvalidInput, ShufflekitError

LedgerOpt = Annotated[
    str | None,
    typer.Option(
        "--ledger",
        help="Ledger URL (default: sqlite:///.shufflekit/ledger.db, in $SHUFFLEKIT_STATE if set).",
    ),
]
DeploymentOpt = Annotated[str, typer.Option("--deployment", help="Deployment (budget) name.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object for scripts.")]


def count(text: str | int) -> int:
    """A count of people as they are written (`--n`, `--users`): 10000000, 10_000_000 or 1e7,
    below 1e16; typer.BadParameter (a usage error, exit 2) otherwise. Its range (at least 1)
    is the command's to check, in one line like every other value it refuses."""
    try:
        value = Decimal(str(text).strip())
    except InvalidOperation:
        value = Decimal("NaN")
    if not value.is_finite() or value != value.to_integral_value():
        raise typer.BadParameter(
            f"{text!r} is not a whole number (write 10000000, 10_000_000 or 1e7)"
        )
    if value.adjusted() > 15:
        raise typer.BadParameter(f"{text} is more people than there are")
    return int(value)


_value_type = TyperOption.display_type_rich


def _flag_type(self: TyperOption, ctx: Any) -> str | None:
    """The value column of `--help`: nothing for a flag (typer 0.29 prints `<bool>` there)."""
    return None if self.is_flag else _value_type(self, ctx)


TyperOption.display_type_rich = _flag_type  # type: ignore[method-assign]

EXIT_USER = 2
EXIT_INTERNAL = 70
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, as a shell reports a command killed by it


def refuse(message: str) -> NoReturn:
    """Stop the command: `message` is what the user gave wrong and how to put it right."""
    raise InvalidInput(message)


def check_eps0(eps0: float, flag: str = "--eps0") -> float:
    """Refuse an eps0 no round can have: k-RR needs e^eps0 in a float, and not 1 (1e-6 <=
    eps0 <= 700)."""
    from shufflekit.accountant.core import EPS0_MAX, EPS0_MIN  # (numpy: not for every --help)

    return real(flag, eps0, EPS0_MIN, EPS0_MAX)


def check_plot_path(path: str) -> None:
    """Refuse a figure path that is not a .png in an existing folder (one line, before work)."""
    p = Path(path)
    if p.suffix.lower() != ".png":
        refuse(f"--plot writes a PNG: give a FILE.png, got {path!r}")
    if not p.parent.is_dir():
        refuse(f"--plot: no folder {str(p.parent)!r} to write {p.name} in")


def describe(exc: BaseException) -> tuple[str, int]:
    """The one-line message and exit code for an exception that left a command."""
    if isinstance(exc, InternalError):
        return f"internal error (a bug in shufflekit; please report it): {exc}", EXIT_INTERNAL
    if isinstance(exc, ShufflekitError):
        return str(exc), exc.exit_code
    if isinstance(exc, OSError):
        where = f": {exc.filename}" if exc.filename else ""
        return f"{exc.strerror or exc}{where}", EXIT_USER
    if isinstance(exc, MemoryError):
        return "out of memory: ask for less (fewer users, rounds or categories)", EXIT_USER
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted", EXIT_INTERRUPTED
    name = type(exc).__name__
    return f"internal error (a bug in shufflekit; please report it): {name}: {exc}", EXIT_INTERNAL


def print_error(message: str) -> None:
    """`error: message` on stderr, printed literally (no markup, no wrapping)."""
    render.err_console.print(
        "error: " + " ".join(message.split("\n")),
        markup=False,
        highlight=False,
        soft_wrap=True,
        style="bold red",
    )


def reflow(text: str | None) -> str | None:
    """A docstring as `--help` should print it: each paragraph one line for the terminal to
    wrap (typer 0.29 keeps the source's line breaks after the first paragraph)."""
    if text is None:
        return None
    return "\n\n".join(" ".join(p.split()) for p in inspect.cleandoc(text).split("\n\n"))


def _reflow_tree(command: Any) -> None:
    command.help = reflow(command.help)
    for sub in getattr(command, "commands", {}).values():
        _reflow_tree(sub)


class ShufflekitGroup(TyperGroup):
    """The root command group: runs a command and maps whatever it raises (see module doc)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _reflow_tree(self)  # the whole tree is built by now: typer makes the root group last

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except (typer.TyperException, typer.Exit, typer.Abort):  # usage errors, --help, exits
            raise
        except BrokenPipeError:  # `... | head`: the reader has what it wanted; say nothing
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # (nor at exit)
            raise typer.Exit(EXIT_BROKEN_PIPE) from None
        except (Exception, KeyboardInterrupt) as exc:  # the one handler
            message, code = describe(exc)
            if os.environ.get("SHUFFLEKIT_DEBUG"):
                traceback.print_exception(exc)
            print_error(message)
            raise typer.Exit(code) from None
