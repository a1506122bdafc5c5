"""The one error handler: every error leaves a command as one line and an exit code."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from shufflekit.accountant.ledger import Ledger
from shufflekit.app.cli import app
from shufflekit.app.cli_common import EXIT_INTERNAL, EXIT_USER, ShufflekitGroup, count, describe
from shufflekit.base.errors import (
    BudgetExceeded,
    InternalError,
    InvalidInput,
    ShufflekitError,
    UnsoundResult,
    UserError,
)
from tests.cli_run import run_cli


def shufflekit(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_cli(list(args), cwd)


def test_the_tree_has_one_root_and_two_branches() -> None:
    assert issubclass(BudgetExceeded, UserError)
    assert issubclass(InvalidInput, ValueError)  # old `except ValueError` callers still work
    assert issubclass(UnsoundResult, InternalError)
    assert not issubclass(InternalError, UserError)
    for cls in (UserError, InternalError):
        assert issubclass(cls, ShufflekitError)


@pytest.mark.parametrize(
    ("exc", "code", "text"),
    [
        (BudgetExceeded("round would exceed the budget"), EXIT_USER, "exceed the budget"),
        (UnsoundResult("upper < lower"), EXIT_INTERNAL, "internal error (a bug"),
        (FileNotFoundError(2, "No such file or directory", "/nope/x.csv"), EXIT_USER, "/nope"),
        (ZeroDivisionError("division by zero"), EXIT_INTERNAL, "ZeroDivisionError"),
        (MemoryError(), EXIT_USER, "out of memory"),
    ],
)
def test_describe_maps_each_kind(exc: BaseException, code: int, text: str) -> None:
    message, got = describe(exc)
    assert got == code
    assert text in message
    assert "\n" not in message


def _app_raising(exc: BaseException) -> typer.Typer:
    demo = typer.Typer(cls=ShufflekitGroup, pretty_exceptions_enable=False)

    @demo.command()
    def boom() -> None:
        raise exc

    @demo.command()
    def fine() -> None:
        typer.echo("ok")

    return demo


@pytest.mark.parametrize(
    ("exc", "code"),
    [(InvalidInput("deployment 'a[/b]' and [mix] stay literal"), 2), (KeyError("x"), 70)],
)
def test_group_prints_one_line_without_traceback(exc: BaseException, code: int) -> None:
    result = CliRunner().invoke(_app_raising(exc), ["boom"])
    assert result.exit_code == code
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1, result.output
    assert lines[0].startswith("error: ")
    assert "Traceback" not in result.output
    if code == 2:
        assert "'a[/b]' and [mix] stay literal" in lines[0]  # no markup eaten


def test_usage_errors_and_success_pass_through() -> None:
    demo = _app_raising(RuntimeError("never"))
    assert CliRunner().invoke(demo, ["fine"]).exit_code == 0
    assert CliRunner().invoke(demo, ["fine", "--no-such-option"]).exit_code == 2


def test_real_commands_fail_in_one_line(tmp_path: Path) -> None:
    cases = [
        (["privacy", "epsilon", "--n", "10", "--k", "3", "--eps0", "-1", "--delta", "1e-6"], 2),
        (["budget", "status", "--ledger", f"sqlite:///{tmp_path}/none.db"], 2),
        (["simulate", "--csv", str(tmp_path / "missing.csv"), "--column", "c"], 2),
    ]
    for argv, code in cases:
        r = shufflekit(*argv, cwd=tmp_path)
        assert r.returncode == code, (argv, r.stderr)
        assert "Traceback" not in r.stderr, argv
        assert len(r.stderr.strip().splitlines()) == 1, (argv, r.stderr)
        assert r.stderr.startswith("error: "), (argv, r.stderr)


def test_the_cli_app_uses_the_handler() -> None:
    result = CliRunner().invoke(
        app, ["privacy", "epsilon", "--n", "10", "--k", "1", "--eps0", "1", "--delta", "1e-6"]
    )
    assert result.exit_code == 2
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("text", "want"), [("1e7", 10_000_000), ("10_000_000", 10_000_000), (" 250 ", 250), (7, 7)]
)
def test_counts_are_read_as_people_write_them(text: str | int, want: int) -> None:
    assert count(text) == want


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("1.5", "not a whole number"),
        ("abc", "not a whole number"),
        ("nan", "not a whole"),
        ("1e30", "more people than there are"),
    ],
)
def test_bad_counts_are_usage_errors(text: str, says: str) -> None:
    with pytest.raises(typer.BadParameter, match=says):
        count(text)
    result = CliRunner().invoke(
        app, ["privacy", "epsilon", "--n", text, "--k", "10", "--eps0", "1", "--delta", "1e-9"]
    )
    assert result.exit_code == 2
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    "argv",
    [
        ["privacy", "epsilon", "--n", "0", "--k", "10", "--eps0", "1", "--delta", "1e-9"],
        ["demo", "--users", "0"],
        ["demo", "--users", "-1e3"],
        ["leakage", "--n", "0", "--k", "3", "--eps0", "1"],
    ],
)
def test_counts_below_one_are_refused_in_one_line(argv: list[str]) -> None:
    """The count is read as written; its range is the command's, refused in one line."""
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output


@pytest.mark.parametrize(
    "argv",
    [
        ["demo", "--users", "200", "--eps0", "1000"],
        ["simulate", "--eps0", "1000"],
        ["simulate", "--eps0", "701"],
        ["experiment", "utility", "--n", "2000", "--eps0-values", "1000"],
        # below 1e-6: e^eps0 rounds towards 1 (a ZeroDivisionError, exit 70, at 1e-17; a
        # 4-minute demo ending in a pydantic dump at 1e-300)
        ["demo", "--users", "200", "--eps0", "1e-300"],
        ["simulate", "--eps0", "1e-17"],
        ["privacy", "epsilon", "--n", "1000", "--k", "10", "--eps0", "1e-17", "--delta", "1e-6"],
        ["privacy", "epsilon", "--round", "1000,10,1e-17,2", "--delta", "1e-6"],
        ["budget", "init", "--epsilon", "1", "--delta", "1e-6", "--round-type", "10,1e-300"],
        # the local model runs k-RR at eps0 = epsilon (1000: OverflowError, exit 70)
        ["experiment", "utility", "--n", "1000", "--epsilons", "1000"],
        ["experiment", "utility", "--n", "1000", "--epsilons", "1e-7"],
    ],
)
def test_an_eps0_no_round_can_have_is_refused_before_anything(
    argv: list[str], tmp_path: Path
) -> None:
    """demo created a budget of type 10,1000 before refusing it (every later demo on that
    ledger was then refused); simulate and experiment overflowed (internal error, exit 70)."""
    db = tmp_path / "l.db"
    args = [*argv, "--ledger", f"sqlite:///{db}"] if argv[0] in ("demo", "budget") else argv
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "[1e-06, 700]" in result.output and len(result.output.strip().splitlines()) == 1
    if db.exists():  # nothing was created: the next demo on this ledger is not refused
        assert not Ledger(f"sqlite:///{db}").has_budget("default")


def test_a_second_demo_of_another_type_says_how_to_run_it(tmp_path: Path) -> None:
    """The first demo fixes its budget's round type: another --k was refused with a hint
    (--mode adaptive) the demo does not have; and budget flags were silently ignored."""
    ledger = ["--ledger", f"sqlite:///{tmp_path / 'l.db'}", "--users", "300"]
    assert CliRunner().invoke(app, ["demo", *ledger]).exit_code == 0
    again = CliRunner().invoke(app, ["demo", *ledger, "--budget-epsilon", "3"])
    assert again.exit_code == 0 and "only shape a new one" in again.output
    other = CliRunner().invoke(app, ["demo", *ledger, "--k", "5"])
    assert other.exit_code == 2 and "--deployment NAME" in other.output
    assert (
        CliRunner().invoke(app, ["demo", *ledger, "--k", "5", "--deployment", "k5"]).exit_code == 0
    )


def test_chaos_replay_speaks_json_and_checks_its_numbers() -> None:
    """`chaos --seed S --json` printed JSON lines, --seed -1 named --first-seed, and
    --workers 0 ran on the default count."""
    out = CliRunner().invoke(app, ["chaos", "--seed", "3", "--json"])
    assert out.exit_code == 0, out.output
    facts = json.loads(out.stdout)
    assert facts["seed"] == 3 and facts["events"] and facts["violations"] == []
    for argv, says in ((["--seed", "-1"], "--seed must"), (["--workers", "0"], "--workers")):
        bad = CliRunner().invoke(app, ["chaos", *argv])
        assert bad.exit_code == 2 and says in bad.output, bad.output


@pytest.mark.parametrize("url", ["sqlite:///:memory:", "sqlite://", ""])
def test_a_ledger_in_memory_or_empty_is_refused(url: str) -> None:
    """`budget init --ledger sqlite:///:memory:` said the budget was created (it vanished);
    demo then failed on a missing table; `--ledger ''` silently used the default ledger."""
    for argv in (["budget", "init", "--epsilon", "1", "--delta", "1e-6"], ["demo"]):
        result = CliRunner().invoke(app, [*argv, "--ledger", url])
        assert result.exit_code == 2, result.output
        assert "--ledger is empty" in result.output or "in memory" in result.output


@pytest.mark.parametrize(
    "command",
    [["simulate"], ["demo"], ["experiment", "utility"], ["experiment", "individual"], ["clients"]],
)
def test_a_negative_seed_is_a_usage_error(command: list[str], tmp_path: Path) -> None:
    """numpy refuses a negative seed: it ended in "internal error", exit 70."""
    led = ["--ledger", f"sqlite:///{tmp_path / 'l.db'}"] if command == ["demo"] else []
    result = CliRunner().invoke(app, [*command, "--seed", "-1", *led])
    assert result.exit_code == 2 and "--seed" in result.output, result.output
    assert "internal error" not in result.output and not (tmp_path / "l.db").exists()


def test_experiment_individual_refuses_a_negative_epsilon() -> None:
    for eps in ("-1", "nan"):
        result = CliRunner().invoke(
            app, ["experiment", "individual", "--n", "2000", "--repetitions", "3", "--epsilon", eps]
        )
        assert result.exit_code == 2 and "--epsilon must be" in result.output, result.output


@pytest.mark.parametrize("plot", ["x.txt", "", "/no/such/folder/x.png"])
def test_a_plot_path_that_cannot_be_a_png_is_refused_before_the_work(plot: str) -> None:
    """PNG bytes went into x.txt, --plot '' was ignored, a missing folder was found after the
    work (about 7 s at n = 1000)."""
    for argv in (
        ["privacy", "compare", "--n", "1000", "--k", "10", "--eps0", "1", "--delta", "1e-6"],
        ["leakage", "--n", "100", "--k", "3", "--eps0", "1"],
    ):
        result = CliRunner().invoke(app, [*argv, "--plot", plot])
        assert result.exit_code == 2 and "--plot" in result.output, result.output


def test_a_bits_demo_refuses_an_estimator_it_would_ignore(tmp_path: Path) -> None:
    """`--estimator clip` was ignored by a bits round, the JSON saying "clip" all the same."""
    argv = ["demo", "--mechanism", "bits", "--bits", "3", "--estimator", "clip"]
    result = CliRunner().invoke(app, [*argv, "--ledger", f"sqlite:///{tmp_path / 'l.db'}"])
    assert result.exit_code == 2 and "--estimator is for k-RR rounds" in result.output
    assert not (tmp_path / "l.db").exists()


def test_an_out_folder_that_cannot_be_written_is_refused_before_the_sweep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`experiment utility --out FILE` ran the whole sweep (minutes), then failed to write and
    threw its results away."""
    import shufflekit.app.experiment as experiment  # (the command imports it when it runs)

    def never(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("the sweep ran")

    monkeypatch.setattr(experiment, "utility_experiment", never)
    (tmp_path / "afile").write_text("")
    argv = ["experiment", "utility", "--n", "1000", "--epsilons", "1", "--out"]
    result = CliRunner().invoke(app, [*argv, str(tmp_path / "afile")])
    assert result.exit_code == 2 and "cannot write to" in result.output, result.output


def test_the_sweep_over_n_takes_counts_written_as_every_count_is(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found by a docs audit: counts of people may be written 1e7 or 10_000_000 (README),
    `--n` took them, `experiment utility --ns 1e3,1e4` was refused as not integers."""
    import shufflekit.app.experiment as experiment  # (the command imports it when it runs)

    seen: list[tuple[int, ...]] = []

    def record(cfg: object, **_kwargs: object) -> None:
        seen.append(cfg.ns)  # type: ignore[attr-defined]
        raise InvalidInput("stop before the sweep")

    monkeypatch.setattr(experiment, "utility_experiment", record)
    argv = ["experiment", "utility", "--ns", "1e3, 10_000,20000", "--epsilons", "1"]
    result = CliRunner().invoke(app, argv)
    assert seen == [(1000, 10_000, 20_000)], result.output
    for bad in ("1e3,1.5", "1000,ten"):
        result = CliRunner().invoke(app, ["experiment", "utility", "--ns", bad])
        assert result.exit_code == 2 and "--ns must be" in result.output, result.output


def test_a_broker_that_resets_the_login_is_one_line(tmp_path: Path) -> None:
    """Found by a docs audit: `clients --broker mqtt://...` on the broker's TLS port printed
    paho's own log line ("failed to receive on socket: ... reset by peer", through logging's
    last resort) above the one-line error."""
    import socket
    import struct
    import threading

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()

    def reset_every_login() -> None:  # as a TLS listener answers a plain MQTT CONNECT
        while True:
            conn, _ = srv.accept()
            conn.recv(1024)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()

    threading.Thread(target=reset_every_login, daemon=True).start()
    url = f"mqtt://127.0.0.1:{srv.getsockname()[1]}"
    r = shufflekit("clients", "--broker", url, "--deployment", "p", "--users", "3", cwd=tmp_path)
    srv.close()
    assert r.returncode == 2 and "use mqtts://" in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: "), r.stderr
