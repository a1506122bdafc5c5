"""`shufflekit budget ...`: create, inspect and correct a deployment's privacy budget.

Only `init` creates a ledger; the other commands open an existing one and fail, creating
nothing, when the ledger or the deployment is missing.
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated

import typer
from rich.table import Table

from shufflekit.accountant.ledger import Budget, Ledger, check_budget
from shufflekit.app.cli_common import DeploymentOpt, JsonOpt, LedgerOpt
from shufflekit.app.render import console, print_json
from shufflekit.app.state import DEFAULT_DEPLOYMENT, default_ledger_url
from shufflekit.base.errors import LedgerNotFound

app = typer.Typer(help="The privacy budget ledger of a deployment.", no_args_is_help=True)


def _open(url: str | None, deployment: str, create: bool = False) -> Ledger:
    """The ledger at `url` (default: the state folder's); LedgerNotFound says how to create one.

    Only `init` passes create=True: reading a missing ledger must not leave an empty one behind.
    """
    try:
        return Ledger(url or default_ledger_url(), create=create)
    except LedgerNotFound as exc:
        raise LedgerNotFound(exc.where, deployment) from None


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
            help="Seconds (> 0) after which an uncommitted reservation expires (never if unset)."
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
    check_budget(b)  # before the ledger is opened: bad arguments create no file
    led = _open(ledger, deployment, create=True)
    led.init_budget(b)
    if json_out:
        print_json(b.__dict__)
    else:
        console.print(
            f"budget of {deployment!r}: epsilon={epsilon:g}, delta={delta:g}, "
            f"n_min={n_min}, max_corrupt={max_corrupt}, cost model {cost_model}"
        )


@app.command()
def status(
    ledger: LedgerOpt = None,
    deployment: DeploymentOpt = DEFAULT_DEPLOYMENT,
    json_out: JsonOpt = False,
) -> None:
    """Spent, reserved and remaining budget, with a per-round table."""
    led = _open(ledger, deployment)
    st = led.status(deployment)
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
    t.add_column("round", no_wrap=True)  # ids are needed whole for `refund`
    t.add_column("status", no_wrap=True)
    for col in ("k", "eps0", "n", "batch", "epsilon alone"):
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
    """The append-only audit log: every decision, who made it (role user@host:pid) and why."""
    led = _open(ledger, deployment)
    rows = led.history(deployment)
    if json_out:
        print_json(rows)
        return
    t = Table()
    for col in ("when (UTC)", "round", "who", "action", "decision", "detail"):
        t.add_column(col)
    for r in rows:
        when = dt.datetime.fromtimestamp(r["at"], dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
        t.add_row(
            when, r["round_id"] or "-", r["who"], r["action"], r["decision"], str(r["detail"])
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
    led = _open(ledger, deployment)
    rec = led.refund(deployment, round_id, actor="operator", reason=reason)
    if json_out:
        print_json(rec.__dict__)
    else:
        console.print(f"round {round_id} is {rec.status}")
