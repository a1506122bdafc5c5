"""The CLI as a newcomer meets it (#18): literal text, no cut tables, help that reads well,
inputs refused before any allocation, malformed CSV refused with its line, progress only on a
terminal. Every test drives the command as a user does: a process on a pipe or a terminal."""

from __future__ import annotations

import math
import re
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from shufflekit.accountant.numerics.roots import bracket_boundary
from shufflekit.app.cli import app
from shufflekit.app.datasets import DatasetError, from_csv
from shufflekit.core.spool import Spool
from tests.cli_run import run_cli, run_cli_tty

APP = Path(__file__).resolve().parent.parent / "shufflekit" / "app"


@pytest.mark.parametrize("command", [[], ["demo"], ["privacy", "compare"], ["simulate"]])
def test_flags_show_no_bool_placeholder(command: list[str]) -> None:
    result = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    assert "<bool>" not in result.output
    assert "--help" in result.output


def test_no_rich_markup_in_the_cli_sources() -> None:
    """Consoles print literally (markup off); a markup tag in a string would print as is."""
    tag = re.compile(r"\[/?(bold|dim|italic|red|green|yellow|blue|cyan|magenta)\]|\[/\]")
    found = [
        f"{p.name}:{i}"
        for p in sorted(APP.rglob("*.py"))
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if tag.search(line) and not line.lstrip().startswith("#")
    ]
    assert not found, f"Rich markup (use render.styled): {found}"


def _csv(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "data.csv"
    path.write_text(text, encoding="utf-8")
    return path


def test_values_and_names_print_literally_and_tables_are_not_cut_on_a_pipe(
    tmp_path: Path,
) -> None:
    long = "a category label much longer than eighty columns " * 2
    labels = ["[coordinator]", "[mix]", "mqtt[s]://broker:8883", "a[/b]", long.strip()]
    rows = "".join(f'"{lab}"\n' for lab in labels for _ in range(30))
    path = _csv(tmp_path, f"where [mix]\n{rows}")
    out = run_cli(["simulate", "--csv", str(path), "--column", "where [mix]"], tmp_path)
    assert out.returncode == 0, out.stderr
    for text in [*labels, "'where [mix]'"]:
        assert text in out.stdout
    assert "…" not in out.stdout
    assert out.stderr == ""  # no progress bar on a pipe


def test_error_messages_keep_every_character(tmp_path: Path) -> None:
    path = _csv(tmp_path, "x\n1\n2\n")
    out = run_cli(["simulate", "--csv", str(path), "--column", "[mix] a[/b]"], tmp_path)
    assert out.returncode == 2
    assert "'[mix] a[/b]' not in" in out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("text", "line", "what"),
    [
        ("a,b\n1,2\n3\n4,5\n", 3, "1 field(s) but the header has 2"),
        ("a,b\n1,2\n1,2,3\n", 3, "3 field(s)"),
        ('a,b\n1,2\n"3,4\n5,6\n', 3, "a quote opened here is never closed"),
        ('a,b\n1,"x"y\n', 2, "',' expected after"),
    ],
)
def test_malformed_csv_is_refused_with_its_line(
    tmp_path: Path, text: str, line: int, what: str
) -> None:
    path = _csv(tmp_path, text)
    with pytest.raises(DatasetError, match=f"line {line}: .*{re.escape(what)}"):
        from_csv(path, "a")
    out = run_cli(["simulate", "--csv", str(path), "--column", "a"], tmp_path)
    assert out.returncode == 2 and f"line {line}" in out.stderr and "Traceback" not in out.stderr


def test_blank_lines_are_no_users_but_not_an_error(tmp_path: Path) -> None:
    col = from_csv(_csv(tmp_path, "a,b\n1,2\n\n3,4\n"), "a")
    assert col.n == 2


@pytest.mark.parametrize(
    ("args", "limit"),
    [
        (["--k", "100000000"], "k <= 4,096"),
        (["--k", "65535", "--estimator", "mle"], "k <= 4,096"),
        (["--rounds", "3000000"], "limit 4 GiB"),
    ],
)
def test_simulate_refuses_sizes_before_allocating(
    tmp_path: Path, args: list[str], limit: str
) -> None:
    t0 = time.monotonic()
    out = run_cli(["simulate", *args], tmp_path)
    assert out.returncode == 2 and limit in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert time.monotonic() - t0 < 60  # refused at once (was 100 s, or a MemoryError)


def test_long_simulation_shows_progress_on_a_terminal_only(tmp_path: Path) -> None:
    tty = run_cli_tty(["simulate", "--rounds", "3000", "--n-boot", "0"], tmp_path)
    assert tty.returncode == 0, tty.stdout
    assert "estimating rounds" in tty.stdout and "/3000 rounds" in tty.stdout
    piped = run_cli(["simulate", "--rounds", "3000", "--n-boot", "0"], tmp_path)
    assert piped.returncode == 0 and piped.stderr == ""
    assert "estimating rounds" not in piped.stdout


def test_bracketing_a_far_boundary_does_not_overflow() -> None:
    """`privacy calibrate --k 10 --rounds 1 --eps0 20 --epsilon 0.01` died of OverflowError:
    the secant step exp(1.1 * dist) overflowed when the boundary was far away (it is capped
    at a factor of 16 anyway). g = 1 - 0.001 ln x has its root at x = e^1000, past the cap."""
    hi = 1e300
    got = bracket_boundary(
        lambda x: math.exp(1.0 - 0.001 * math.log(x)),
        1.0,
        1.0,
        1.0,
        hi,
        feasible_below=False,
        integer=False,
    )
    assert got == (None, hi)
    # and a near boundary is still found on both sides: root at x = e^5
    feas, inf = bracket_boundary(
        lambda x: math.exp(5.0 - math.log(x)),
        1.0,
        1.0,
        1.0,
        hi,
        feasible_below=False,
        integer=False,
    )
    assert feas is not None and inf is not None and inf < math.exp(5.0) <= feas


def test_a_corrupted_spool_is_quarantined_not_a_traceback(tmp_path: Path) -> None:
    """(tests/test_spool_hygiene.py has the details: one error line names both files.)"""
    path = tmp_path / "mix0.sqlite"
    path.write_bytes(b"this is not a database, it was overwritten by mistake " * 100)
    spool = Spool(path)
    assert spool.quarantined is not None and spool.quarantined.exists()
    spool.close()


def test_a_sqlite_ledger_url_naming_a_folder_is_refused(tmp_path: Path) -> None:
    out = run_cli(["demo", "--users", "50", "--ledger", f"sqlite:///{tmp_path}"], tmp_path)
    assert out.returncode == 2, out.stderr
    assert "is a folder" in out.stderr and "internal error" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
