"""`shufflekit rounds`: the running and recent rounds of a deployment, from its ledger and, when
a broker is given, the round it currently announces (its retained announcement).

A round is running while the ledger holds it as reserved; recent rounds are the latest others
(committed, refunded, expired), newest first.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from typing import TYPE_CHECKING, Annotated, Any

import typer

from shufflekit.app import render
from shufflekit.app.cli_common import DeploymentOpt, JsonOpt, LedgerOpt
from shufflekit.app.render import print_json
from shufflekit.app.state import DEFAULT_DEPLOYMENT, open_ledger

if TYPE_CHECKING:  # the ledger, the client and MQTT are imported when the command runs
    from shufflekit.accountant.ledger import Ledger, RoundRecord
    from shufflekit.core.messages import Announcement
    from shufflekit.core.transport.base import Transport


def listing(
    ledger: Ledger, deployment: str, limit: int, announced: Announcement | None
) -> dict[str, Any]:
    """The JSON form: `running` (reserved) and `recent` rounds, and the broker's announcement."""
    recs = list(ledger.rounds_of(deployment))
    running = [r for r in recs if r.status == "reserved"]
    recent = sorted(
        (r for r in recs if r.status != "reserved"), key=lambda r: r.updated_at, reverse=True
    )[:limit]

    def row(r: RoundRecord) -> dict[str, Any]:
        d = r.as_dict()
        d["announced"] = announced is not None and announced.round_id == r.round_id
        return d

    return {
        "deployment": deployment,
        "running": [row(r) for r in running],
        "recent": [row(r) for r in recent],
        "announced": None
        if announced is None
        else {
            "round_id": announced.round_id,
            "k": announced.k,
            "eps0": announced.eps0,
            "n_min": announced.n_min,
            "deadline": announced.deadline,
            "mixes": len(announced.mix_keys),
        },
    }


async def announced_round(
    transport: Transport, deployment: str, wait: float
) -> Announcement | None:
    """The deployment's retained announcement, or None if none arrives within `wait` seconds."""
    from shufflekit.client.agent import current_announcement

    with contextlib.suppress(TimeoutError):
        return await current_announcement(transport, deployment, wait)
    return None


async def _from_broker(url: str, deployment: str, wait: float) -> Announcement | None:
    from shufflekit.core.transport.mqtt import BrokerAddress, MqttTransport

    async with MqttTransport(BrokerAddress.parse(url)) as t:
        return await announced_round(t, deployment, wait)


def _when(t: float | None) -> str:
    if not t:
        return "-"
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def rounds(
    ledger: LedgerOpt = None,
    deployment: DeploymentOpt = DEFAULT_DEPLOYMENT,
    broker: Annotated[
        str | None,
        typer.Option(
            "--broker",
            help="mqtt:// or mqtts://host:port of the clients' listener: also show the round "
            "the broker announces (as SHUFFLEKIT_MQTT_USERNAME=client with its "
            "SHUFFLEKIT_MQTT_PASSWORD: a service's account would take its session over).",
        ),
    ] = None,
    limit: Annotated[int, typer.Option(min=0, help="How many recent rounds to list.")] = 20,
    wait: Annotated[
        float, typer.Option(min=0.0, help="Seconds to wait for the retained announcement.")
    ] = 2.0,
    json_out: JsonOpt = False,
) -> None:
    """List the running and recent rounds of a deployment (ledger, and broker if given)."""
    import asyncio

    from rich.table import Table

    led = open_ledger(ledger, deployment)
    led.budget(deployment)  # LedgerError naming an unknown deployment
    ann = asyncio.run(_from_broker(broker, deployment, wait)) if broker else None
    data = listing(led, deployment, limit, ann)
    if json_out:
        print_json(data)
        return
    a = data["announced"]
    if broker is not None:
        line = (
            "broker announces no round"
            if a is None
            else f"broker announces round {a['round_id']} (k={a['k']}, eps0={a['eps0']:g}, "
            f"n_min={a['n_min']}, ingest closes {_when(a['deadline'])} UTC)"
        )
        render.console.print(line, markup=False, highlight=False, soft_wrap=True)
    for title in ("running", "recent"):
        t = Table(title=f"{title} rounds of {deployment!r}")
        t.add_column("round", no_wrap=True)  # ids are needed whole (`budget refund`)
        for col in ("status", "type", "batch", "epsilon", "updated (UTC)", "out"):
            t.add_column(col)
        for r in data[title]:
            head = f"{r['k']}" if r["mechanism"] == "krr" else f"{r['mechanism']}:{r['k']}"
            t.add_row(
                r["round_id"] + (" (announced)" if r["announced"] else ""),
                r["status"],
                f"{head},{r['eps0']:g}",
                str(r["batch_size"] or "-"),
                f"{r['epsilon_round']:.4g}",
                _when(r["updated_at"])[5:],
                "yes" if r["published_at"] else "-",
            )
        render.console.print(t)
