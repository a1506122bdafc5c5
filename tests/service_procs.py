"""Child processes of one test (`python -m shufflekit ...`), as the services run when deployed.

stdout and stderr go to files (no pipe can fill up); the `procs` fixture in conftest.py kills
every one still running at teardown.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


class Procs:
    """Named child processes; logs in `folder`, run in `cwd` with `env` (default: inherited)."""

    def __init__(
        self, folder: Path, *, cwd: Path = ROOT, env: dict[str, str] | None = None
    ) -> None:
        self.folder, self.cwd, self.env = folder, cwd, env
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(
        self, name: str, *args: str, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """`shufflekit ARGS` as `name`; `env` replaces the default environment."""
        with (
            (self.folder / f"{name}.out").open("wb") as out,
            (self.folder / f"{name}.err").open("wb") as err,
        ):
            p = subprocess.Popen(
                [sys.executable, "-m", "shufflekit", *args],
                stdout=out,
                stderr=err,
                cwd=self.cwd,
                env=env if env is not None else self.env,
            )
        self.procs[name] = p
        return p

    def stderr(self, name: str) -> str:
        return (self.folder / f"{name}.err").read_text()

    def lines(self, name: str) -> list[dict[str, Any]]:
        """The JSON objects a service printed on stdout, one per complete line (a line still
        being written, without its newline yet, is left for the next call)."""
        text = (self.folder / f"{name}.out").read_text()
        return [json.loads(line) for line in text.split("\n")[:-1] if line.strip()]

    def wait_log(self, name: str, text: str, timeout: float = 60.0) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if text in self.stderr(name):
                return
            if self.procs[name].poll() is not None:
                break
            time.sleep(0.1)
        raise AssertionError(f"{name} never logged {text!r}:\n{self.stderr(name)}")

    def stop(self, name: str, timeout: float = 60.0) -> int:
        """SIGTERM and the exit code (the test fails if it does not exit in time)."""
        p = self.procs[name]
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
        try:
            return p.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{name} ignored SIGTERM:\n{self.stderr(name)}") from None

    def kill_all(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
                p.wait(10)
