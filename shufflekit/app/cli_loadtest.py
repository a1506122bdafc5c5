"""`shufflekit loadtest`: simulated users on Locust against a whole deployment, with a report."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Annotated, Any

import typer

from shufflekit.app.cli_common import JsonOpt
from shufflekit.app.render import console, err_console, print_json
from shufflekit.base.errors import ConfigError


def loadtest(
    users: Annotated[int, typer.Option(min=1, help="Simulated users per round.")] = 10_000,
    rounds: Annotated[int, typer.Option(min=1, help="Rounds.")] = 3,
    mixes: Annotated[int, typer.Option(min=1, max=16, help="Mixes in the cascade.")] = 2,
    k: Annotated[int, typer.Option(min=2, help="Categories.")] = 10,
    eps0: Annotated[float, typer.Option(min=0.0, help="Local epsilon of k-RR.")] = 2.0,
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
    seed: Annotated[int, typer.Option(help="Seed of who drops out, straggles, misbehaves.")] = 0,
    floor_seconds: Annotated[
        float, typer.Option(min=0.05, help="Seconds spent measuring the crypto floor.")
    ] = 2.0,
    json_out: JsonOpt = False,
) -> None:
    """Load-test a deployment with simulated users on Locust: started here on loopback
    (Mosquitto, mixes, analyzer, coordinator as processes), or an existing one (--config)."""
    if importlib.util.find_spec("locust") is None or importlib.util.find_spec("paho") is None:
        raise ConfigError(
            "the load test needs Locust and paho-mqtt: pip install 'shufflekit[loadtest]'"
        )
    from shufflekit.app.loadtest.run import LoadTestOptions, run_loadtest

    opts = LoadTestOptions(
        users=users,
        rounds=rounds,
        mixes=mixes,
        k=k,
        eps0=eps0,
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
    live = not json_out and err_console.is_terminal
    if live:
        with err_console.status("starting") as status:
            out = run_loadtest(opts, lambda s: status.update(s, spinner="dots"))
    else:
        out = run_loadtest(opts)
    if json_out:
        print_json(out)
        return
    _print(out, report)


def _line(text: str) -> None:
    console.print(text, markup=False, highlight=False, soft_wrap=True)


def _print(out: dict[str, Any], report: Path | None) -> None:
    lat, rl = out["publish_latency_ms"], out["round_latency_s"]
    _line(
        f"{out['users_per_round']:,} users x {out['rounds']} rounds: "
        f"{out['rounds_released']} released; {out['reports_sent']:,} reports sent, "
        f"{out['reports_acknowledged']:,} acknowledged, {out['reports_counted']:,} counted, "
        f"{out['reports_lost']} lost"
    )
    _line(f"rejected: {out['reports_rejected']}")
    _line(
        f"throughput {out['throughput_reports_per_s']:,} reports/s = {out['floor_ratio']} of "
        f"the crypto floor ({out['crypto_floor_reports_per_s']:,} reports/s)"
    )
    _line(
        f"publish latency (PUBACK) ms: p50 {lat['p50']}, p95 {lat['p95']}, p99 {lat['p99']}, "
        f"max {lat['max']}; round latency s: p50 {rl['p50']}, max {rl['max']}"
    )
    _line("stages (s/round): " + ", ".join(f"{k} {v}" for k, v in out["stages_s"].items()))
    _line("peak RSS (MB): " + ", ".join(f"{k} {v}" for k, v in out["peak_rss_mb"].items()))
    if report is not None:
        _line(f"report: {report / 'report.html'}")
