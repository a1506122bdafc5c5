"""`shufflekit budget ...`: create, inspect, correct and delete a deployment's privacy budget.

Only `init` creates a ledger; the other commands open an existing one and fail, creating
nothing, when the ledger or the deployment is missing. Only `init` and `upgrade` bring a
ledger of an older shufflekit forward; the others refuse it, changing nothing.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import shlex
from typing import TYPE_CHECKING, Annotated

import typer

from shufflekit.app import render
from shufflekit.app.cli_common import DeploymentOpt, JsonOpt, LedgerOpt, count
from shufflekit.app.render import print_json
from shufflekit.app.state import DEFAULT_DEPLOYMENT, ledger_url, open_ledger
from shufflekit.base.errors import InvalidInput, LedgerNotFound

if TYPE_CHECKING:  # the ledger (SQLAlchemy, the accountant) is imported by the commands using it
    from shufflekit.accountant.ledger import BudgetStatus

app = typer.Typer(help="The privacy budget ledger of a deployment.", no_args_is_help=True)


def _say(text: str) -> None:
    """Print text literally (names and messages may hold brackets)."""
    render.console.print(text, markup=False, highlight=False, soft_wrap=True)


@app.command()
def init(
    epsilon: Annotated[float, typer.Option(help="Total epsilon promised to participants.")],
    delta: Annotated[float, typer.Option(help="Total delta promised to participants.")],
    # counts as people write them (1e3 too); their ranges are check_budget's, in one line
    n_min: Annotated[
        int, typer.Option(parser=count, help="Smallest batch any round may release (>= 1).")
    ] = 1000,
    max_corrupt: Annotated[
        int, typer.Option(parser=count, help="Assumed corrupt clients per round (>= 0).")
    ] = 0,
    max_round_epsilon: Annotated[float | None, typer.Option(help="Per-round epsilon cap.")] = None,
    reservation_ttl: Annotated[
        float | None,
        typer.Option(
            help="Seconds (> 0) after which an uncommitted reservation expires (never if unset)."
        ),
    ] = None,
    cost_model: Annotated[
        str,
        typer.Option(
            help="How rounds compose: tight (PLD composition, or the Rényi filter in adaptive "
            "mode) or ldp (sum of eps0: valid under adaptive choice too)."
        ),
    ] = "tight",
    mode: Annotated[
        str,
        typer.Option(
            help="planned: rounds follow the --round-type schedule fixed now (tight PLD "
            "composition); adaptive: any round type in any order, through a Rényi-DP filter."
        ),
    ] = "planned",
    round_type: Annotated[
        list[str] | None,
        typer.Option(
            "--round-type",
            help="K,EPS0[,COUNT] or bits:L,EPS0[,COUNT], repeatable, in order: the planned "
            "schedule (only the last may omit COUNT; without any, the first round fixes the "
            "type of every round).",
        ),
    ] = None,
    ledger: LedgerOpt = None,
    deployment: DeploymentOpt = DEFAULT_DEPLOYMENT,
    json_out: JsonOpt = False,
) -> None:
    """Create a deployment's budget (refuses to overwrite one)."""
    from shufflekit.accountant.ledger import Budget, check_budget
    from shufflekit.accountant.round_types import parse_round_type

    schedule = tuple(parse_round_type(t) for t in round_type or [])
    b = Budget(
        deployment,
        epsilon,
        delta,
        n_min,
        max_corrupt,
        max_round_epsilon,
        reservation_ttl,
        cost_model,
        mode=mode,
        schedule=schedule,
    )
    check_budget(b)  # before the ledger is opened: bad arguments create no file
    led = open_ledger(ledger, deployment, create=True)
    led.init_budget(b)
    if json_out:  # the guarantee too, as the text says it (and `budget status --json`)
        print_json(b.as_dict() | {"guarantee": b.guarantee()})
    else:
        _say(
            f"budget of {deployment!r}: epsilon={epsilon:g}, delta={delta:g}, "
            f"n_min={n_min}, max_corrupt={max_corrupt}, cost model {cost_model}, mode {mode}"
            + (f", schedule {' '.join(str(e) for e in schedule)}" if schedule else "")
        )
        _say(f"guarantee: {b.guarantee()}")


def _policy_lines(st: BudgetStatus) -> list[str]:
    """The whole policy of a budget, one fact a line, for people."""
    b = st.budget
    sched = " then ".join(
        f"{e.count} x {e.type}" if e.count is not None else f"{e.type} from then on"
        for e in b.schedule
    )
    if b.mode == "planned" and not b.schedule:
        first = next((r for r in st.rounds if r.status in ("reserved", "committed")), None)
        sched = f"open: every round like the first ({first.round_type if first else 'none yet'})"
    lines = [
        f"deployment {b.deployment!r}: budget epsilon {b.epsilon_total:g} at delta "
        f"{b.delta_total:g}, mode {b.mode}, cost model {b.cost_model}",
        f"guarantee: {b.guarantee()}",
        f"policy: n_min {b.n_min}, max_corrupt {b.max_corrupt}, per-round cap "
        f"{'none' if b.max_round_epsilon is None else f'{b.max_round_epsilon:g}'}, "
        "reservation TTL "
        f"{'none' if b.reservation_ttl is None else f'{b.reservation_ttl:g} s'}",
    ]
    if b.mode == "planned":
        lines.append(f"schedule: {sched}")
    if b.migrated_from is not None:
        lines.append(
            f"note: created under ledger schema {b.migrated_from} and migrated to a planned "
            "budget whose schedule is the types of the rounds it held"
        )
    d = st.as_dict()
    lines.append(
        f"epsilon committed {st.epsilon_committed:.6g}; committed or reserved "
        f"{st.epsilon_spent_or_reserved:.6g} (open reservations add "
        f"{d['epsilon_reserved_increment']:.6g}); remaining {st.epsilon_remaining:.6g}"
    )
    return lines


@app.command()
def status(
    ledger: LedgerOpt = None,
    deployment: DeploymentOpt = DEFAULT_DEPLOYMENT,
    json_out: JsonOpt = False,
) -> None:
    """The budget's policy and guarantee, committed and reserved epsilon, and every round."""
    from rich.table import Table

    led = open_ledger(ledger, deployment)
    st = led.status(deployment)
    lease = led.running(deployment)  # None once its lease ran out: its holder died
    if json_out:
        print_json(st.as_dict() | {"coordinator": dataclasses.asdict(lease) if lease else None})
        return
    for line in _policy_lines(st):
        _say(line)
    if lease is not None:
        _say(f"coordinator: {lease.holder}, running since {_utc(lease.since)} UTC")
    else:
        _say("coordinator: none running")
    t = Table()
    widest = max((len(r.round_id) for r in st.rounds), default=5)
    t.add_column("round", no_wrap=True, min_width=widest)  # whole: `budget refund` takes it
    for col in ("status", "slot", "type", "n", "batch", "epsilon alone", "published"):
        t.add_column(col, overflow="fold")  # these fold on a narrow terminal, the id never
    for r in st.rounds:
        t.add_row(
            r.round_id,
            r.status,
            "-" if r.slot is None else str(r.slot + 1),
            str(r.round_type),
            str(r.n_accounted),
            str(r.batch_size or "-"),
            f"{r.epsilon_round:.6g}",
            "yes" if r.published_at is not None else "-",
        )
    render.console.print(t)


@app.command()
def history(
    ledger: LedgerOpt = None,
    deployment: DeploymentOpt = DEFAULT_DEPLOYMENT,
    json_out: JsonOpt = False,
) -> None:
    """The append-only audit log: every decision, who made it (role user@host:pid) and why."""
    from rich.table import Table

    led = open_ledger(ledger, deployment)
    rows = led.history(deployment)
    if json_out:  # one object, as every --json gives
        print_json({"deployment": deployment, "history": rows})
        return
    t = Table()
    widest = max((len(r["round_id"] or "-") for r in rows), default=5)
    for col in ("when (UTC)", "round", "who", "action", "decision", "detail"):
        whole = col == "round"  # ids are needed whole (`budget refund`)
        t.add_column(col, no_wrap=whole, min_width=widest if whole else None, overflow="fold")
    for r in rows:
        row = (r["round_id"] or "-", r["who"], r["action"], r["decision"], _detail(r["detail"]))
        t.add_row(_utc(r["at"]), *row)
    render.console.print(t)


def _utc(t: float) -> str:
    """A ledger stamp (Unix seconds) as a UTC date and time."""
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def _detail(detail: object) -> str:
    """An audit row's detail as `key=value` pairs, the unset ones left out (--json has all)."""
    if not isinstance(detail, dict):
        return str(detail)
    return " ".join(f"{k}={_value(v)}" for k, v in detail.items() if v not in (None, [], {}))


def _value(v: object) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    return v if isinstance(v, str) else json.dumps(v, separators=(",", ":"))


@app.command()
def refund(
    round_id: str,
    reason: Annotated[str, typer.Option(help="Why.")] = "operator",
    ledger: LedgerOpt = None,
    deployment: DeploymentOpt = DEFAULT_DEPLOYMENT,
    json_out: JsonOpt = False,
) -> None:
    """Refund a reserved round that released nothing (a committed round is never refunded).

    Refused while a mix holds the coordinator's go to forward the round (at most a batch
    timeout): the analyzer would see a round whose cost was given back. The error says how long.
    """
    led = open_ledger(ledger, deployment)
    rec = led.refund(deployment, round_id, actor="operator", reason=reason)
    if json_out:
        print_json(rec.as_dict())
    else:
        _say(f"round {round_id} is {rec.status}")


@app.command()
def upgrade(ledger: LedgerOpt = None, json_out: JsonOpt = False) -> None:
    """Bring a ledger made by an older shufflekit forward to this one's schema.

    The other commands refuse an older ledger rather than change it; the services bring it
    forward when they start. Stop services of the older version first: they refuse it after.
    A SQLite ledger's integrity is checked first (PRAGMA integrity_check): a damaged one is
    refused, changing nothing.
    """
    from shufflekit.accountant.ledger import Ledger
    from shufflekit.accountant.ledger_schema import SCHEMA_VERSION, redact

    url = ledger_url(ledger)
    try:
        led = Ledger(url, create=False, check="integrity_check")  # damaged: one line, exit 2
    except LedgerNotFound as exc:  # the hint names the ledger given, to be pasted
        raise LedgerNotFound(exc.where, None, ledger and shlex.quote(redact(url))) from None
    with led:
        before = led.schema_found
    if json_out:
        print_json({"ledger": redact(url), "schema_before": before, "schema": SCHEMA_VERSION})
    elif before < SCHEMA_VERSION:
        _say(f"ledger {redact(url)}: schema {before} brought forward to {SCHEMA_VERSION}")
    else:
        _say(f"ledger {redact(url)}: already at schema {SCHEMA_VERSION}, nothing to do")


@app.command()
def delete(
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask for confirmation.")] = False,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Delete even a budget with committed (released) rounds, or whose coordinator "
            "is running.",
        ),
    ] = False,
    ledger: LedgerOpt = None,
    deployment: DeploymentOpt = DEFAULT_DEPLOYMENT,
    json_out: JsonOpt = False,
) -> None:
    """Delete a budget and its rounds (e.g. a test budget); the audit log keeps the deletion.

    Asks first (unless --yes); refused for a budget with committed rounds, or while its
    coordinator runs (its lease in the ledger is live), unless --force.
    """
    from shufflekit.accountant.ledger_store import running_refusal

    led = open_ledger(ledger, deployment)
    led.budget(deployment)  # LedgerError for an unknown deployment, before asking
    committed = sum(1 for r in led.rounds_of(deployment) if r.status == "committed")
    if committed and not force:  # (the ledger refuses it too) before asking, not after
        raise InvalidInput(
            f"deployment {deployment!r} has {committed} committed round(s): its budget "
            "records a promise made to participants; delete it anyway with --force"
        )
    running = led.running(deployment)
    if running is not None and not force:  # (the ledger refuses it too) before asking
        raise running_refusal(deployment, running.holder)
    if not yes:
        if json_out:
            raise InvalidInput("--json cannot ask for confirmation: add --yes")
        try:
            sure = typer.confirm(f"Delete the budget of {deployment!r} and all its rounds?")
        except typer.Abort:  # end of input before an answer (a script); Ctrl-C is Abort too
            raise InvalidInput(
                "no answer to the confirmation: not deleted; add --yes to delete without asking"
            ) from None
        if not sure:
            raise InvalidInput("not deleted")
    n = led.delete_budget(deployment, force=force)
    if json_out:
        print_json({"deployment": deployment, "deleted": True, "rounds_deleted": n})
    else:
        _say(f"deleted the budget of {deployment!r} and its {n} round(s)")
