"""The `shufflekit` command line: demo, budget, privacy, leakage, simulate, keys, serve, clients.

Importing it registers every command and nothing more: each command imports what it runs (the
accountant, the services, numpy, SQLAlchemy) when it runs, so `--version`, `--help` and a
light command do not pay seconds for the heavy ones (tests/test_cli_startup.py guards this).
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from shufflekit.analyzer.names import ESTIMATORS
from shufflekit.app.cli_budget import app as budget_app
from shufflekit.app.cli_chaos import chaos
from shufflekit.app.cli_common import (
    DeploymentOpt,
    JsonOpt,
    LedgerOpt,
    ShufflekitGroup,
    check_eps0,
    count,
    print_error,
    refuse,
)
from shufflekit.app.cli_leakage import leakage
from shufflekit.app.cli_loadtest import loadtest
from shufflekit.app.cli_privacy import app as privacy_app
from shufflekit.app.cli_round_list import rounds
from shufflekit.app.cli_simulate import experiment_app, simulate
from shufflekit.app.services.cli import clients, keys_app, serve_app
from shufflekit.app.state import DEFAULT_DEPLOYMENT

app = typer.Typer(
    help="shufflekit: the shuffle model of differential privacy, end to end.",
    no_args_is_help=True,
    add_completion=False,
    cls=ShufflekitGroup,
    pretty_exceptions_enable=False,
)


def _version(show: bool) -> None:
    if show:
        from importlib.metadata import version as package_version

        typer.echo(f"shufflekit {package_version('shufflekit')}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """shufflekit: the shuffle model of differential privacy, end to end."""


app.add_typer(budget_app, name="budget")
app.command()(simulate)
app.add_typer(experiment_app, name="experiment")
app.add_typer(privacy_app, name="privacy")
app.add_typer(keys_app, name="keys")
app.add_typer(serve_app, name="serve")
app.command()(clients)
app.command()(chaos)
app.command()(loadtest)
app.command()(leakage)
app.command()(rounds)


@app.command()
def demo(
    users: Annotated[int, typer.Option(parser=count, help="Simulated users.")] = 10_000,
    k: Annotated[int, typer.Option(min=2, max=65535, help="Categories.")] = 10,
    eps0: Annotated[float, typer.Option(help="Local epsilon of k-RR (1e-6 to 700).")] = 2.0,
    mixes: Annotated[int, typer.Option(min=1, max=16, help="Mixes in the cascade.")] = 1,
    rounds: Annotated[int, typer.Option(min=1, help="Rounds to run.")] = 1,
    seed: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="Seed of the users' values and k-RR responses: the same seed and options give "
            "the same result (histograms, estimates; not timings or round ids). Default: "
            "responses from the OS CSPRNG. Mix permutations and encryption always use it.",
        ),
    ] = None,
    ledger: LedgerOpt = None,
    deployment: DeploymentOpt = DEFAULT_DEPLOYMENT,
    budget_epsilon: Annotated[
        float, typer.Option(help="Total epsilon if the deployment has no budget yet.")
    ] = 10.0,
    budget_delta: Annotated[
        float, typer.Option(help="Total delta if the deployment has no budget yet.")
    ] = 1e-6,
    cost_model: Annotated[
        str, typer.Option(help="Cost model if the deployment has no budget yet: tight or ldp.")
    ] = "tight",
    estimator: Annotated[
        str, typer.Option(help=f"How the analyzer denoises: one of {', '.join(ESTIMATORS)}.")
    ] = "inv",
    mechanism: Annotated[
        str, typer.Option(help="krr (k-RR over --k values) or bits (L-bit records, --bits).")
    ] = "krr",
    bits: Annotated[
        int | None,
        typer.Option(min=1, max=16, help="Bits per record L (with --mechanism bits)."),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Run shuffle-model rounds end to end on the embedded default (in-memory, SQLite).

    If the deployment has no budget yet, one is created from --budget-* (a notice on stderr
    says so). With --mechanism bits --bits L each user holds an L-bit record and flips each
    bit (eps0 per record); the result has per-bit estimates with standard errors.

    Exit 1 if no round released anything (each says why); 2 for a refused value or budget.
    """
    import asyncio

    from shufflekit.accountant.ledger import Ledger
    from shufflekit.app.demo import DemoConfig, run_demo
    from shufflekit.app.render import err_console, print_json, progress_bar
    from shufflekit.app.simulate import MAX_K
    from shufflekit.app.state import ledger_url

    if users < 1:
        refuse(f"--users must be at least 1, got {users}")
    check_eps0(eps0)
    if mechanism not in ("krr", "bits"):
        refuse(f"--mechanism must be krr or bits, got {mechanism!r}")
    if mechanism == "bits" and bits is None:
        refuse("--mechanism bits needs --bits L (bits per record, 1..16)")
    if mechanism == "krr" and bits is not None:
        refuse("--bits needs --mechanism bits")
    if mechanism == "bits" and estimator != "inv":  # it was ignored, the JSON saying otherwise
        refuse("--estimator is for k-RR rounds: a bits round is estimated per bit and record (inv)")
    if estimator not in ESTIMATORS:
        refuse(f"unknown estimator {estimator!r}; choose one of {', '.join(ESTIMATORS)}")
    if estimator != "inv" and k > MAX_K:  # their bootstrap draws from a k x k law
        refuse(
            f"--estimator {estimator} with k = {k:,}: its bootstrap draws from a k x k law and "
            f"allows k <= {MAX_K:,}; use --estimator inv (closed form) for larger k"
        )
    cfg = DemoConfig(
        users=users,
        k=k,
        eps0=eps0,
        mixes=mixes,
        rounds=rounds,
        seed=seed,
        deployment=deployment,
        budget_epsilon=budget_epsilon,
        budget_delta=budget_delta,
        cost_model=cost_model,
        estimator=estimator,
        mechanism=mechanism,
        bits=bits,
    )
    led = Ledger(ledger_url(ledger))
    with progress_bar("clients answering", users * rounds, quiet=json_out) as update:
        out = asyncio.run(
            run_demo(
                cfg,
                led,
                progress=lambda i, _t: update(i),
                notice=lambda line: err_console.print(
                    line, soft_wrap=True, highlight=False, markup=False
                ),
            )
        )
    if json_out:
        print_json(out)
    else:
        _print_demo(out)
    if out["refused"]:
        refuse(f"round refused: {out['refused']}")
    if not any(r["released"] for r in out["rounds"]):
        print_error("no round released anything (see above)")
        raise typer.Exit(1)


def _print_bits(last: dict[str, Any]) -> None:
    from rich.table import Table

    from shufflekit.app.render import console, styled

    t = Table(
        title=f"round {last['round_id']}: {last['batch_size']} reports of {last['bits']}-bit "
        "records: frequency of ones per bit"
    )
    for col in ("bit", "true", "estimate", "± 1 s.e."):
        t.add_column(col, justify="right")
    for b in last["bit_estimates"]:
        t.add_row(str(b["bit"]), f"{b['true']:.4f}", f"{b['estimate']:.4f}", f"{b['stderr']:.4f}")
    console.print(t)
    console.print(
        styled(
            "largest error: ",
            (f"{last['max_abs_error']:.4f}", "bold"),
            f" ({last['max_abs_error_in_stderr']:.2f} standard errors)"
            + (
                f"; whole records: total variation distance {last['tv_distance']:.4f}"
                if last.get("tv_distance") is not None
                else ""
            ),
        )
    )
    note = last.get("privacy", {}).get("accounting")
    if note:
        console.print(f"accounting: {note}")


def _print_demo(out: dict[str, Any]) -> None:
    from rich.table import Table

    from shufflekit.app.render import console, err_console, styled

    if out.get("rounds"):
        last = out["rounds"][-1]
        if last["released"] and last.get("mechanism") == "bits":
            _print_bits(last)
        elif last["released"]:
            t = Table(
                title=f"round {last['round_id']}: {last['batch_size']} reports, "
                f"estimator {last['estimator']}"
            )
            for col in ("category", "true", "shuffled (noisy)", "estimate", "± 1 s.e."):
                t.add_column(col, justify="right")
            for i, (a, b, c, s) in enumerate(
                zip(
                    last["true_histogram"],
                    last["noisy_histogram"],
                    last["estimate"],
                    last["stderr"],
                    strict=True,
                )
            ):
                t.add_row(str(i), str(a), str(b), f"{c:.1f}", f"{s:.1f}")
            console.print(t)
            console.print(
                styled(
                    "total variation distance (truth vs the estimate projected onto the simplex): ",
                    (f"{last['tv_distance']:.4f}", "bold"),
                )
            )
            statement = (last.get("privacy") or {}).get("statement")
            if statement:
                console.print(f"what a participant risks: {statement}", soft_wrap=True)
        for r in out["rounds"]:
            if not r["released"]:
                abort = r.get("abort") or {}
                why = f" (hop {abort['hop']}: {abort['reason']})" if abort else ""
                console.print(f"round {r['round_id']} released nothing{why}; its cost is refunded")
        stuck = [r["round_id"] for r in out["rounds"] if r.get("estimator_converged") is False]
        if stuck:
            err_console.print(
                f"warning: the {out['estimator']} estimate did not converge in round(s) "
                f"{', '.join(stuck)}: it is the last EM step (see docs/experiments.md)"
            )
        for r in out["rounds"]:
            if r["rejected"]:
                counts = ", ".join(f"{n} {why}" for why, n in sorted(r["rejected"].items()))
                console.print(f"round {r['round_id']} rejected: {counts}")
    p = out["privacy_spent"]
    console.print(
        styled(
            "privacy spent: epsilon = ",
            (f"{p['epsilon']:.4g}", "bold"),
            f" at delta = {p['delta']:.3g} over {p['rounds_committed']} committed round(s) "
            f"(cost model: {p['cost_model']}); budget {p['epsilon_budget']:.4g}, "
            f"remaining {p['epsilon_remaining']:.4g}",
        )
    )
    see = f" (see it with `{out['status_command']}`)" if out.get("status_command") else ""
    console.print(f"ledger: {out['ledger']}{see}")


def main() -> None:
    """Console-script entry point: `ShufflekitGroup` maps every error to one line."""
    app(prog_name="shufflekit")
