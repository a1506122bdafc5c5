"""Benchmark: how long the `shufflekit` command takes to start (target: `--version` and `--help`
near what importing typer costs, a command paying only for the modules it runs).

Each case is a fresh `python -m shufflekit ...` process, timed from start to exit; the median of
`--repeats` runs (after one warm-up) is printed with its ratio to the references timed in the
same run: `python -c pass` (the interpreter alone), `python -c "import typer"` (the floor of
any typer program) and a typer app of one command with an eager `--version` (its `--version`
and `CMD --help`: typer builds the command and, to run one, loads pydantic). The real command
is `budget status --json` of a ledger made by `budget init` beforehand, in a temporary state
folder. Bytecode is cached as after an install (PYTHONDONTWRITEBYTECODE is dropped), so the
warm-up run compiles and the timed ones do not.

With `--before DIR` the same cases also run on the shufflekit of another checkout (DIR first on
PYTHONPATH, e.g. a `git worktree` of the commit before a change), interleaved with this one's,
so both see the same machine load.

Run: .venv/bin/python benchmarks/bench_cli_startup.py [--repeats N] [--before DIR]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _timing import load_line

RESULTS = Path(__file__).resolve().parent / "results" / "cli_startup.txt"
FLOOR_APP = """
from typing import Annotated
import typer
app = typer.Typer(add_completion=False, no_args_is_help=True)
def _version(show: bool) -> None:
    if show:
        typer.echo("floor 0")
        raise typer.Exit()
@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True)] = False,
) -> None:
    \"\"\"An app of one command.\"\"\"
@app.command()
def hello(name: str = "x") -> None:
    \"\"\"Say hello.\"\"\"
app()
"""
CASES: dict[str, list[str]] = {
    "--version": ["--version"],
    "--help": ["--help"],
    "budget --help": ["budget", "--help"],
    "budget status --json": ["budget", "status", "--json"],
}


def commit_of(folder: Path) -> str:
    """The checkout's commit (short hash), or the folder itself when git cannot say."""
    out = subprocess.run(
        ["git", "-C", str(folder), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return out.stdout.strip() if out.returncode == 0 else str(folder)


def run_once(argv: list[str], env: dict[str, str], cwd: str) -> float:
    """Seconds of one process running `argv` to its exit (it must exit 0)."""
    start = time.perf_counter()
    subprocess.run(argv, env=env, cwd=cwd, check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--before", type=Path, help="another checkout to time alongside this one")
    args = ap.parse_args()
    state = tempfile.mkdtemp()  # the cwd too: `python -m` puts it first on sys.path
    env = {**os.environ, "SHUFFLEKIT_STATE": state, "COLUMNS": "100"}
    env.pop("PYTHONPATH", None)
    # as installed: the modules' bytecode is cached after the warm-up, not compiled at each start
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    py = [sys.executable]
    init = ["budget", "init", "--epsilon", "1", "--delta", "1e-6"]
    subprocess.run(
        [*py, "-m", "shufflekit", *init], env=env, cwd=state, check=True, stdout=subprocess.DEVNULL
    )
    versions = {"after": env}
    if args.before is not None:
        versions = {"before": env | {"PYTHONPATH": str(args.before.resolve())}, "after": env}
    runs: dict[tuple[str, str], list[float]] = {}
    floor = Path(state) / "floor.py"
    floor.write_text(FLOOR_APP)
    ref_argv = {
        "python -c pass": [*py, "-c", "pass"],
        "python -c 'import typer'": [*py, "-c", "import typer"],
        "one-command typer app --version": [*py, str(floor), "--version"],
        "one-command typer app CMD --help": [*py, str(floor), "hello", "--help"],
    }
    refs: dict[str, list[float]] = {name: [] for name in ref_argv}
    for i in range(args.repeats + 1):  # round 0 warms the disk cache and is not kept
        times = {name: run_once(argv, env, state) for name, argv in ref_argv.items()}
        for name, case in CASES.items():
            for which, which_env in versions.items():
                t = run_once([*py, "-m", "shufflekit", *case], which_env, state)
                times[f"{which}\0{name}"] = t
        if i == 0:
            continue
        for key, t in times.items():
            if key in refs:
                refs[key].append(t)
            else:
                which, name = key.split("\0")
                runs.setdefault((which, name), []).append(t)
    ref = {name: statistics.median(ts) for name, ts in refs.items()}
    typer_import = ref["python -c 'import typer'"]
    lines = [
        f"shufflekit start-up, median of {args.repeats} fresh processes each "
        "(benchmarks/bench_cli_startup.py)",
        f"machine: {platform.machine()}, python {platform.python_version()}; {load_line()}",
        *(
            f"{which}: the code of commit {commit_of(folder)}"
            for which, folder in (("before", args.before), ("after", Path(__file__).parents[1]))
            if which in versions and folder is not None
        ),
        *(
            f"reference: {name}: {t * 1000:.0f} ms ({t / typer_import:.2f} x import typer)"
            for name, t in ref.items()
        ),
    ]
    for name in CASES:
        for which in versions:
            t = statistics.median(runs[(which, name)])
            label = f"{which + ': ' if len(versions) > 1 else ''}{name}"
            ratio = t / typer_import
            lines.append(f"{label:<36} {t * 1000:7.0f} ms  ({ratio:5.2f} x import typer)")
        if len(versions) > 1:
            gain = statistics.median(runs[("before", name)]) / statistics.median(
                runs[("after", name)]
            )
            lines.append(f"{'':<36} {gain:7.1f} x faster")
    text = "\n".join(lines)
    print(text)
    RESULTS.write_text(text + "\n")


if __name__ == "__main__":
    main()
