"""`shufflekit budget ...`: create, inspect and correct a deployment's privacy budget."""

from __future__ import annotations

import datetime as dt
from typing import Annotated

import typer
from rich.table import Table

from accountant.errors import AccountantError
from accountant.ledger import Budget, Ledger
from shufflekit.render import console, fail, print_json
from shufflekit.state import DEFAULT_DEPLOYMENT, default_ledger_url

app = typer.Typer(help="The privacy budget ledger of a deployment.", no_args_is_help=True)

LedgerOpt = Annotated[
    str | None, typer.Option("--ledger", help="Ledger URL (default: SQLite in the state folder).")
]
DeploymentOpt = Annotated[str, typer.Option("--deployment", help="Deployment (budget) name.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object for scripts.")]


def _open(url: str | None) -> Ledger:
    try:
        return Ledger(url or default_ledger_url())
    except AccountantError as exc:
        fail(str(exc))
        raise  # unreachable: fail exits


@app.command()
def init(
    epsilon: Annotated[float, typer.Option(help="Total epsilon promised to participants.")],
    delta: Annotated[float, typer.Option(help="Total delta promised to participants.")],
    n_min: Annotated[int, typer.Option(min=1, help="Smallest batch any round may release.")] = 1000,
    max_corrupt: Annotated[int, typer.Option(min=0, help="Assumed corrupt clients per round.")] = 0,
    max_round_epsilon: Annotated[float | None, typer.Option(help="Per-round epsilon cap.")] = None,
    reservation_ttl: Annotated[
        float | None,
        typer.Option(
            help="Seconds after which an uncommitted reservation expires (never if unset)."
        ),
    ] = None,
    cost_model: Annotated[
        str, typer.Option(help="How rounds compose: tight (PLD composition) or ldp (sum of eps0).")
    ] = "tight",
    ledger: LedgerOpt = None,
    deployment: DeploymentOpt = DEFAULT_DEPLOYMENT,
    json_out: JsonOpt = False,
) -> None:
    """Create a deployment's budget (refuses to overwrite one)."""
    led = _open(ledger)
    b = Budget(
        deployment,
        epsilon,
        delta,
        n_min,
        max_corrupt,
        max_round_epsilon,
        reservation_ttl,
        cost_model,
    )
    try:
        led.init_budget(b)
    except AccountantError as exc:
        fail(str(exc))
    if json_out:
        print_json(b.__dict__)
    else:
        console.print(
            f"budget of {deployment!r}: epsilon={epsilon:g}, delta={delta:g}, "
            f"n_min={n_min}, max_corrupt={max_corrupt}"
        )


@app.command()
def status(
    ledger: LedgerOpt = None,
    deployment: DeploymentOpt = DEFAULT_DEPLOYMENT,
    json_out: JsonOpt = False,
) -> None:
    """Spent, reserved and remaining budget, with a per-round table."""
    led = _open(ledger)
    try:
        st = led.status(deployment)
    except AccountantError as exc:
        fail(str(exc))
        return
    if json_out:
        print_json(st.as_dict())
        return
    b = st.budget
    console.print(
        f"deployment {deployment!r}: budget epsilon={b.epsilon_total:g} at "
        f"delta={b.delta_total:g} (cost model {st.cost_model})"
    )
    console.print(
        f"spent {st.epsilon_spent:.6g}, spent+reserved {st.epsilon_reserved:.6g}, "
        f"remaining {st.epsilon_remaining:.6g}"
    )
    t = Table()
    for col in ("round", "status", "k", "eps0", "n accounted", "batch", "epsilon alone"):
        t.add_column(col)
    for r in st.rounds:
        t.add_row(
            r.round_id,
            r.status,
            str(r.k),
            f"{r.eps0:g}",
            str(r.n_accounted),
            str(r.batch_size or "-"),
            f"{r.epsilon_round:.6g}",
        )
    console.print(t)


@app.command()
def history(
    ledger: LedgerOpt = None,
    deployment: DeploymentOpt = DEFAULT_DEPLOYMENT,
    json_out: JsonOpt = False,
) -> None:
    """The append-only audit log: every decision, who made it and why."""
    led = _open(ledger)
    rows = led.history(deployment)
    if json_out:
        print_json(rows)
        return
    t = Table()
    for col in ("when (UTC)", "round", "actor", "action", "decision", "detail"):
        t.add_column(col)
    for r in rows:
        when = dt.datetime.fromtimestamp(r["at"], dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
        t.add_row(
            when, r["round_id"] or "-", r["actor"], r["action"], r["decision"], str(r["detail"])
        )
    console.print(t)


@app.command()
def refund(
    round_id: str,
    reason: Annotated[str, typer.Option(help="Why.")] = "operator",
    ledger: LedgerOpt = None,
    deployment: DeploymentOpt = DEFAULT_DEPLOYMENT,
    json_out: JsonOpt = False,
) -> None:
    """Refund a reserved round that released nothing (a committed round is never refunded)."""
    led = _open(ledger)
    try:
        rec = led.refund(deployment, round_id, actor="operator", reason=reason)
    except AccountantError as exc:
        fail(str(exc))
        return
    if json_out:
        print_json(rec.__dict__)
    else:
        console.print(f"round {round_id} is {rec.status}")
