"""`shufflekit chaos`: the whole deployment as seeded simulations under injected faults."""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import TYPE_CHECKING, Annotated

import typer

from shufflekit.app import render
from shufflekit.app.cli_common import JsonOpt, count
from shufflekit.app.render import print_json, progress_bar
from shufflekit.app.sim.fault_kinds import FAULT_KINDS
from shufflekit.base.errors import InvalidInput, UserError

if TYPE_CHECKING:  # the simulation (services, ledger, crypto) is imported when the command runs
    from shufflekit.app.sim.chaos import ChaosConfig, ChaosReport
    from shufflekit.app.sim.world import SeedOutcome

DEFAULT_SEEDS = 100


class PromiseBroken(UserError):
    """A simulated seed broke an invariant (exit 1: the finding, not a usage error)."""

    exit_code = 1


def chaos(
    seeds: Annotated[int | None, typer.Option(help="How many seeds to run (default: 100).")] = None,
    first_seed: Annotated[int | None, typer.Option(help="The first seed (default: 0).")] = None,
    seed: Annotated[
        int | None, typer.Option(help="Replay this one seed and print its trace (JSON lines).")
    ] = None,
    users: Annotated[
        int, typer.Option(parser=count, help="Users per round: each draws from U/4 to U.")
    ] = 200,
    mixes: Annotated[int, typer.Option(help="Mixes in the cascade.")] = 2,
    rounds: Annotated[int, typer.Option(help="Rounds per seed.")] = 2,
    faults: Annotated[
        str, typer.Option(help=f"Comma-separated fault kinds: {', '.join(FAULT_KINDS)}.")
    ] = ",".join(FAULT_KINDS),
    real_crypto: Annotated[
        bool, typer.Option("--real-crypto", help="The real HPKE onion instead of the stand-in.")
    ] = False,
    workers: Annotated[
        int | None, typer.Option(help="Worker processes (default: one per core).")
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Run the real services on a simulated faulty network, checking every promise each step.

    Seed by seed, on a virtual clock; exit 1 if any seed broke a promise."""
    from shufflekit.app.sim.chaos import ChaosConfig, default_workers, run_chaos

    if seed is not None and seed < 0:
        raise InvalidInput(f"--seed must be >= 0, got {seed}")
    if seed is not None:  # a replay runs that seed alone: a sweep's options would be ignored
        for flag, given in (
            ("--seeds", seeds),
            ("--first-seed", first_seed),
            ("--workers", workers),
        ):
            if given is not None:
                raise InvalidInput(f"--seed replays one seed: {flag} does not apply")
    seeds = DEFAULT_SEEDS if seeds is None else seeds
    cfg = ChaosConfig(
        seeds=seeds,
        first_seed=0 if first_seed is None else first_seed,
        users=users,
        mixes=mixes,
        rounds=rounds,
        faults=tuple(f.strip() for f in faults.split(",") if f.strip()),
        real_crypto=real_crypto,
        workers=default_workers() if workers is None else workers,  # 0 is refused, not 1 core
    )
    if seed is not None:
        _replay(cfg, seed, json_out)
        return
    with progress_bar("seeds", seeds, "seeds", quiet=json_out) as update:
        report = run_chaos(cfg, lambda done, broken: update(done, f"seeds ({broken} broke)"))
    out = report.as_dict()
    if json_out:
        print_json(out)
    else:
        _print(report, out)
    if out["violations"]:
        raise PromiseBroken(
            f"{len({v['seed'] for v in out['violations']})} seed(s) broke a promise; "
            f"replay one with: {out['violations'][0]['replay']}"
        )


def _replay(cfg: ChaosConfig, seed: int, json_out: bool) -> None:
    """The seed's trace: one JSON line per event and a summary on stderr, or with --json one
    object (the summary's facts, the violations and the events)."""
    from shufflekit.app.sim.chaos import replay

    out = replay(cfg, seed)
    if json_out:
        facts = dataclasses.asdict(out)
        del facts["tail"]  # (the last events, already in `events`)
        for v in facts["violations"]:  # as a sweep's --json gives them
            v["replay"] = cfg.replay_command(seed)
        print_json(facts)
    else:
        for event in out.events:
            sys.stdout.write(json.dumps(event, sort_keys=True) + "\n")
        render.err_console.print(_summary(out), markup=False, highlight=False, soft_wrap=True)
    if out.violations:
        raise PromiseBroken(f"seed {seed} broke: {out.violations[0].invariant}")


def _summary(out: SeedOutcome) -> str:
    return (
        f"seed {out.seed}: {out.rounds_run} round(s), {out.rounds_released} released, "
        f"{out.rounds_refunded} refunded, {out.rounds_expired} expired; "
        f"{out.reports_receipted} reports receipted, "
        f"{out.reports_counted} counted; trace sha256 {out.trace_sha256[:16]}"
    )


def _print(report: ChaosReport, out: dict[str, object]) -> None:
    _line(
        f"{out['seeds_run']} seeds from {out['first_seed']} in {out['seconds']} s: "
        f"{out['rounds_run']} rounds, {out['rounds_released']} released, "
        f"{out['rounds_refunded']} refunded, {out['rounds_expired']} expired; "
        f"{out['reports_receipted']} reports "
        f"receipted, {out['reports_counted']} counted"
    )
    _line(f"faults injected: {out['faults_injected']}")
    _line(f"trace sha256: {out['trace_sha256']}")
    broken = [o for o in report.outcomes if o.violations]
    if not broken:
        _line("every invariant held after every step of every seed")
        return
    for o in broken[:5]:
        for v in o.violations:
            _line(f"seed {o.seed}, t = {v.t:.3f} s: {v.invariant}: {v.detail}")
        _line(f"  replay: {report.config.replay_command(o.seed)}")
        for event in o.tail[-8:]:
            _line("  " + json.dumps(event, sort_keys=True))
    if len(broken) > 5:
        _line(f"... and {len(broken) - 5} more seed(s); --json lists every violation")


def _line(text: str) -> None:
    """One line for people, printed literally and never wrapped (pipes keep it whole)."""
    render.console.print(text, markup=False, highlight=False, soft_wrap=True)
