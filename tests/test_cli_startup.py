"""The command line starts without loading what its commands run: `--version`, `--help` and
`GROUP --help` import typer and the option declarations, not the accountant's engines, numpy,
scipy, SQLAlchemy, dp_accounting, the services or the simulator (1.7 s on every invocation, when
shufflekit.app.cli imported every command's modules; benchmarks/bench_cli_startup.py times it).

Checked by what is in `sys.modules`, in a fresh interpreter, never by the clock.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

#: Third-party packages only a command's body may load. (Not pydantic: typer 0.29 itself loads
#: it to coerce the options of any command it runs, `GROUP --help` included.)
HEAVY = ("numpy", "scipy", "sqlalchemy", "dp_accounting", "cryptography", "aiomqtt")
#: The shufflekit modules registering the commands may load: the command modules, their
#: shared options and output, and the tiny modules of names their `--help` lists.
LIGHT = {
    "shufflekit.accountant",  # (its names load on first use: PEP 562)
    "shufflekit.accountant.method_names",
    "shufflekit.analyzer",  # (the same)
    "shufflekit.analyzer.names",
    "shufflekit.app.experiment_options",
    "shufflekit.app.render",
    "shufflekit.app.services.cli",
    "shufflekit.app.sim.fault_kinds",
    "shufflekit.app.state",
    "shufflekit.core.wire",
}
PACKAGES = {"shufflekit", "shufflekit.app", "shufflekit.app.services", "shufflekit.app.sim"}
PACKAGES |= {"shufflekit.base", "shufflekit.core"}

# Runs the console script's `main` with ARGV and prints, as JSON, the modules loaded at exit.
PROBE = """
import json, sys
sys.argv = ["shufflekit", *json.loads(sys.argv[1])]
from shufflekit.app.cli import main
try:
    main()
except SystemExit:
    pass
sys.__stderr__.write("\\nMODULES " + json.dumps(sorted(sys.modules)) + "\\n")
"""


def loaded(args: list[str]) -> set[str]:
    """The modules loaded by `shufflekit ARGS` (its `main`, in a fresh interpreter)."""
    out = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(args)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "100"},
    )
    line = out.stderr.rsplit("MODULES ", 1)
    assert len(line) == 2, out.stderr
    return set(json.loads(line[1]))


def too_heavy(modules: set[str]) -> list[str]:
    """What registering the commands should not have loaded."""
    heavy = sorted(m for m in modules if m.split(".")[0] in HEAVY)
    ours = sorted(
        m
        for m in modules
        if m.startswith("shufflekit.")
        and m not in LIGHT | PACKAGES
        and not m.startswith("shufflekit.app.cli")
        and not m.startswith("shufflekit.base.")
    )
    return heavy + ours


@pytest.mark.parametrize(
    "args",
    [["--version"], ["--help"], ["budget", "--help"], ["privacy", "epsilon", "--help"], []],
    ids=lambda a: " ".join(a) or "(no arguments)",
)
def test_version_and_help_load_no_command_body(args: list[str]) -> None:
    assert too_heavy(loaded(args)) == []


def test_the_probe_sees_what_a_command_loads() -> None:
    """The check above can fail: a command that computes loads the accountant's engines."""
    args = ["privacy", "epsilon", "--n", "1000", "--k", "2", "--eps0", "1", "--delta", "1e-6"]
    heavy = too_heavy(loaded(args))
    assert "shufflekit.accountant.tight" in heavy and "scipy" in heavy


def test_version_loads_no_output_library_nor_event_loop() -> None:
    """`--version` prints one line through typer: Rich (the consoles are made on first use),
    asyncio (the clock) and pydantic (typer loads it to run a command) stay out."""
    modules = loaded(["--version"])
    assert sorted(m for m in modules if m.split(".")[0] in ("rich", "asyncio", "pydantic")) == []


@pytest.mark.parametrize(
    ("args", "unused"),
    [
        pytest.param(
            ["simulate", "--users", "1000", "--estimator", "nope"],
            ("sqlalchemy", "cryptography"),
            id="simulate",
        ),
        pytest.param(
            ["keys", "new", "--role", "nope", "--out", "never-written"],
            ("numpy", "scipy", "sqlalchemy"),
            id="keys new",
        ),
        pytest.param(
            ["loadtest", "--mechanism", "nope"],
            ("scipy", "sqlalchemy", "cryptography"),
            id="loadtest",
        ),
    ],
)
def test_a_command_loads_what_it_uses(args: list[str], unused: tuple[str, ...]) -> None:
    """`simulate` needs k-RR, not the client's agent (MQTT, cryptography) nor the ledger; `keys`
    the cryptography, not numpy; `loadtest` refuses an option before loading the load test."""
    modules = loaded(args)
    assert sorted(m for m in modules if m.split(".")[0] in unused) == []
