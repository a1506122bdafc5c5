"""`shufflekit loadtest`: simulated users on Locust against a whole deployment, with a report."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from typing import Annotated, Any

import typer

from shufflekit.app import render
from shufflekit.app.cli_common import JsonOpt, check_eps0, count
from shufflekit.app.render import print_json
from shufflekit.base.errors import ConfigError
from shufflekit.core.wire import MAX_RECORD_BITS


def loadtest(
    users: Annotated[int, typer.Option(parser=count, help="Simulated users per round.")] = 10_000,
    rounds: Annotated[int, typer.Option(min=1, help="Rounds.")] = 3,
    mixes: Annotated[int, typer.Option(min=1, max=16, help="Mixes in the cascade.")] = 2,
    k: Annotated[int, typer.Option(min=2, help="Categories.")] = 10,
    eps0: Annotated[float, typer.Option(help="Local epsilon per report (1e-6 to 700).")] = 2.0,
    mechanism: Annotated[
        str, typer.Option(help="krr (k-RR over --k values) or bits (--bits L per record).")
    ] = "krr",
    bits: Annotated[
        int | None, typer.Option(help="Bits per record L (with --mechanism bits).")
    ] = None,
    ramp: Annotated[float, typer.Option(min=0.0, help="Seconds over which clients arrive.")] = 0.0,
    dropout: Annotated[float, typer.Option(help="Fraction of clients that never send.")] = 0.0,
    stragglers: Annotated[
        float, typer.Option(help="Fraction that send after the round closed.")
    ] = 0.0,
    bad_fraction: Annotated[
        float, typer.Option(help="Fraction sending malformed or foreign reports.")
    ] = 0.0,
    workers: Annotated[
        int | None, typer.Option(min=1, help="Locust worker processes (default: one per core).")
    ] = None,
    connections: Annotated[
        int, typer.Option(min=1, help="MQTT connections per worker (each carries many clients).")
    ] = 4,
    tls: Annotated[bool, typer.Option("--tls/--no-tls", help="TLS to the broker.")] = True,
    deadline: Annotated[
        float, typer.Option(min=1.0, help="Round deadline in seconds (rounds close earlier).")
    ] = 600.0,
    report: Annotated[
        Path | None, typer.Option("--report", help="Write report.json, CSVs, report.html here.")
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option("--config", help="Drive this existing deployment instead of starting one."),
    ] = None,
    seed: Annotated[
        int, typer.Option(min=0, help="Seed of who drops out, straggles, misbehaves.")
    ] = 0,
    floor_seconds: Annotated[
        float, typer.Option(min=0.05, help="Seconds spent measuring the crypto floor.")
    ] = 2.0,
    json_out: JsonOpt = False,
) -> None:
    """Load-test a deployment with simulated users on Locust, here on loopback or --config.

    Without --config it starts Mosquitto, the mixes, the analyzer and the coordinator here as
    processes on loopback; with --config it drives an existing deployment."""
    if importlib.util.find_spec("locust") is None or importlib.util.find_spec("paho") is None:
        raise ConfigError(
            "the load test needs Locust and paho-mqtt: pip install 'shufflekit[loadtest]'"
        )
    from shufflekit.accountant.round_types import MAX_K

    if mechanism not in ("krr", "bits"):
        raise ConfigError(f"--mechanism is krr or bits, got {mechanism!r}")
    if mechanism == "bits":
        if bits is None or not 1 <= bits <= MAX_RECORD_BITS:
            raise ConfigError(f"--mechanism bits needs --bits L with 1 <= L <= {MAX_RECORD_BITS}")
        k = 1 << bits
    elif bits is not None:
        raise ConfigError("--bits goes with --mechanism bits")
    # what a service would refuse minutes later, refused before anything starts (the users and
    # the fractions: by the load plan, `run_loadtest`'s first step)
    check_eps0(eps0)
    if mechanism != "bits" and k > MAX_K:  # (a bits round of L = 16 has k = 65536)
        raise ConfigError(f"--k must be at most {MAX_K}, got {k}")
    if not math.isfinite(deadline):
        raise ConfigError(f"--deadline must be a finite number of seconds, got {deadline}")
    if ramp >= deadline:
        raise ConfigError(
            f"--ramp {ramp:g} s must end before the round's --deadline {deadline:g} s: clients "
            "arriving after the deadline are never counted"
        )
    if not floor_seconds <= 60:
        raise ConfigError(f"--floor-seconds must be at most 60, got {floor_seconds}")
    from shufflekit.app.loadtest.run import LoadTestOptions, run_loadtest  # (past the checks)

    opts = LoadTestOptions(
        users=users,
        rounds=rounds,
        mixes=mixes,
        k=k,
        eps0=eps0,
        bits=bits if mechanism == "bits" else None,
        ramp=ramp,
        dropout=dropout,
        stragglers=stragglers,
        bad_fraction=bad_fraction,
        workers=workers or 0,
        connections_per_worker=connections,
        tls=tls,
        deadline=deadline,
        report_dir=report,
        config=config,
        seed=seed,
        floor_seconds=floor_seconds,
    )
    live = not json_out and render.err_console.is_terminal
    if live:
        with render.err_console.status("starting") as status:
            out = run_loadtest(opts, lambda s: status.update(s, spinner="dots"))
    else:
        out = run_loadtest(opts)
    if json_out:
        print_json(out)
        return
    _print(out, report)


def _line(text: str) -> None:
    render.console.print(text, markup=False, highlight=False, soft_wrap=True)


def _print(out: dict[str, Any], report: Path | None) -> None:
    lat, ack, rl = out["publish_latency_ms"], out["puback_latency_ms"], out["round_latency_s"]
    receipted = out["reports_receipted"]
    _line(
        f"{out['users_per_round']:,} users x {out['rounds']} round{'s' * (out['rounds'] != 1)}: "
        f"{out['rounds_released']} released; {out['reports_sent']:,} reports sent, "
        f"{out['reports_acknowledged']:,} acknowledged, "
        f"{'no receipts' if receipted is None else f'{receipted:,} receipted'}, "
        f"{out['reports_counted']:,} counted, {out['reports_lost']} lost"
    )
    _line(f"rejected: {out['reports_rejected']}")
    if out["reports_unreceipted"]:
        _line(f"{out['reports_unreceipted']:,} reports given up without a receipt")
    for a in out["rounds_aborted"]:
        _line(f"round {a['round']} ({a['round_id']}) not released: {a['reason']}")
    _line(
        f"throughput {out['throughput_reports_per_s']:,} reports/s = {out['floor_ratio']} of "
        f"the crypto floor ({out['crypto_floor_reports_per_s']:,} reports/s)"
    )
    until = "PUBACK" if receipted is None else "receipt"
    _line(
        f"publish latency (until the {until}) ms: p50 {lat['p50']}, p95 {lat['p95']}, "
        f"p99 {lat['p99']}, max {lat['max']}; until the PUBACK: p50 {ack['p50']}, "
        f"p99 {ack['p99']}"
    )
    _line(f"round latency s: p50 {rl['p50']}, max {rl['max']}")
    _line("stages (s/round): " + ", ".join(f"{k} {v}" for k, v in out["stages_s"].items()))
    _line("peak RSS (MB): " + ", ".join(f"{k} {v}" for k, v in out["peak_rss_mb"].items()))
    if report is not None:
        _line(f"report: {report / 'report.html'}")
