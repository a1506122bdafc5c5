"""Run the `shufflekit` command as a user does: a separate process, its own state folder."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path


def run_cli(
    args: list[str], cwd: Path | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    """`python -m shufflekit ARGS` with the state folder under `cwd` and extra `env`."""
    full = {**os.environ, "COLUMNS": "120", **env}
    full.pop("SHUFFLEKIT_DEBUG", None)
    if cwd is not None:
        full["SHUFFLEKIT_STATE"] = str(cwd / "state")
    return subprocess.run(
        [sys.executable, "-m", "shufflekit", *args],
        cwd=cwd,
        env=full,
        capture_output=True,
        text=True,
        timeout=600,
    )


def run_cli_tty(
    args: list[str], cwd: Path, columns: int = 100, **env: str
) -> subprocess.CompletedProcess[str]:
    """`shufflekit ARGS` on a pseudo-terminal (util-linux `script`): what a person sees there.

    stdout and stderr are both the terminal, so they arrive merged in `stdout`.
    """
    full = {**os.environ, "COLUMNS": str(columns), "SHUFFLEKIT_STATE": str(cwd / "state"), **env}
    full.pop("SHUFFLEKIT_DEBUG", None)
    command = shlex.join([sys.executable, "-m", "shufflekit", *args])
    return subprocess.run(
        ["script", "-qec", command, "/dev/null"],
        cwd=cwd,
        env=full,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=600,
    )
