"""`shufflekit privacy ...`: per-round and composed privacy of shuffled k-RR, every method.

Each answer states its method, its soundness label (only sound upper bounds may enforce a
budget), the matching lower bound where the method has one, and the time it took. delta may
underflow a float, so `log_delta` is always given too.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Annotated, Any

import typer

from shufflekit.accountant.method_names import method_names
from shufflekit.app import render
from shufflekit.app.cli_common import JsonOpt, check_plot_path, count, refuse
from shufflekit.app.render import print_json, progress_bar, styled, working
from shufflekit.app.state import DEFAULT_DEPLOYMENT
from shufflekit.base.errors import AccountantError

if TYPE_CHECKING:  # the accountant (numpy, scipy, the bounds) is imported by what computes
    from rich.table import Table
    from rich.text import Text

    from shufflekit.accountant import calibrate
    from shufflekit.accountant.core import Mechanism

app = typer.Typer(
    help="Privacy of shuffled k-RR: bounds, composition, calibration.", no_args_is_help=True
)

# n and k are checked by Mechanism (one-line typed errors naming the valid range)
N = Annotated[int, typer.Option("--n", parser=count, help="Users per round.")]
K = Annotated[int, typer.Option("--k", help="Categories.")]
EPS0 = Annotated[float, typer.Option("--eps0", help="Local epsilon of k-RR.")]
ROUNDS = Annotated[int, typer.Option("--rounds", min=1, help="Identical rounds composed.")]
METHOD = Annotated[str, typer.Option("--method", help="Bound: " + ", ".join(method_names(True)))]


def _mech(n: int, k: int, eps0: float) -> Mechanism:
    from shufflekit.accountant.core import Mechanism

    return Mechanism(n=n, k=k, eps0=eps0)


def _label(soundness: str) -> Text:
    from shufflekit.accountant.core import Soundness

    if soundness == Soundness.SOUND_UPPER.value:
        return styled(("sound upper bound", "green"))
    if soundness == Soundness.LOWER_BOUND.value:
        return styled(("lower bound", "yellow"))
    return styled(("NOT a DP guarantee", "red"))


def _show(row: dict[str, Any], json_out: bool, quantity: str, tail: str, lower: str | None) -> None:
    """One answer of `privacy epsilon|delta`: the JSON row, or lines for people that start with
    `quantity = row[quantity]` in bold, then `tail`."""
    if json_out:
        print_json(row)
        return
    headline = styled(f"{quantity} = ", (f"{row[quantity]:.6g}", "bold"), tail)
    render.console.print(styled(f"{row['method']} (", _label(row["soundness"]), "): ", headline))
    if lower is not None:
        render.console.print(f"lower bound (explicit attack): {lower}")
    if row.get("note"):
        render.console.print(f"note: {row['note']}")
    render.console.print(f"({row['seconds']:.3g} s)")


def _epsilon_gap(row: dict[str, Any]) -> str | None:
    """The lower-bound line of an epsilon answer: the attack's epsilon and the gap to it."""
    if row["lower_bound"] is None:
        return None
    gap = 100 * (row["epsilon"] / row["lower_bound"] - 1) if row["lower_bound"] else math.inf
    return f"{row['lower_bound']:.6g}; gap {gap:.3g}%"


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.6g}"


@app.command()
def epsilon(
    delta: Annotated[
        float | None, typer.Option(help="Target delta (with --from-ledger: the budget's).")
    ] = None,
    n: Annotated[int | None, typer.Option("--n", parser=count, help="Users per round.")] = None,
    k: Annotated[int | None, typer.Option("--k", help="Categories.")] = None,
    eps0: Annotated[float | None, typer.Option("--eps0", help="Local epsilon of k-RR.")] = None,
    rounds: ROUNDS = 1,
    method: METHOD = "tight",
    round_spec: Annotated[
        list[str] | None,
        typer.Option(
            "--round",
            help="A round type N,K,EPS0[,COUNT] (K may be bits:L); repeat for heterogeneous "
            "rounds, composed as the ledger composes its rounds.",
        ),
    ] = None,
    from_ledger: Annotated[
        str | None,
        typer.Option(
            "--from-ledger", help="Ledger URL: compose the deployment's committed rounds."
        ),
    ] = None,
    deployment: Annotated[
        str, typer.Option("--deployment", help="Deployment (budget) name, with --from-ledger.")
    ] = DEFAULT_DEPLOYMENT,
    json_out: JsonOpt = False,
) -> None:
    """epsilon at a target delta (upper bound, with the tight method's lower bound)."""
    from shufflekit.accountant.registry import get_method

    if from_ledger is None and deployment != DEFAULT_DEPLOYMENT:
        refuse("--deployment names the budget to read with --from-ledger URL; give that too")
    if round_spec or from_ledger is not None:
        _epsilon_of_rounds(
            round_spec or [],
            from_ledger,
            deployment,
            delta,
            json_out,
            given=(n, k, eps0, rounds, method),
        )
        return
    if n is None or k is None or eps0 is None or delta is None:
        refuse("give --n, --k, --eps0 and --delta (or --round N,K,EPS0[,COUNT], or --from-ledger)")
    from shufflekit.app.privacy_rows import epsilon_row

    mech = _mech(n, k, eps0)
    with working(f"epsilon ({method}, {rounds} round(s))", quiet=json_out):
        row = epsilon_row(get_method(method), mech, delta, rounds)
    tail = f" at delta = {delta:g} for {rounds} round(s) of n={n}, k={k}, eps0={eps0:g}"
    _show(row, json_out, "epsilon", tail, _epsilon_gap(row))


def _epsilon_of_rounds(
    specs: list[str],
    ledger_url: str | None,
    deployment: str,
    delta: float | None,
    json_out: bool,
    given: tuple[Any, ...],
) -> None:
    """`privacy epsilon --round ...` / `--from-ledger`: heterogeneous rounds (`cli_rounds`)."""
    from shufflekit.app import cli_rounds

    n, k, eps0, rounds, method = given
    if n is not None or k is not None or eps0 is not None or rounds != 1 or method != "tight":
        refuse("--round / --from-ledger take no --n, --k, --eps0, --rounds or --method")
    if specs and ledger_url is not None:
        refuse("give either --round (repeatable) or --from-ledger, not both")
    model, mode = "tight", "planned"
    ledger_spent = None
    cache = None
    if ledger_url is not None:
        if not ledger_url.strip():  # (state.ledger_url would name --ledger)
            refuse("--from-ledger is empty: give the ledger's URL (sqlite:///path/ledger.db)")
        held = cli_rounds.ledger_rounds(ledger_url, deployment)
        model, mode, ledger_spent, cache = (
            held.cost_model,
            held.mode,
            held.epsilon_spent,
            held.curves,
        )
        parsed: list[tuple[Any, int]] = [(c, 1) for c in held.charges]
        if delta is None:
            delta = held.delta
        elif delta != held.delta:
            ledger_spent = None  # the ledger's own figure is at its budget's delta
    else:
        parsed = [cli_rounds.parse_round(sp) for sp in specs]
    if delta is None:
        refuse("give --delta")
    with working("epsilon of the rounds", quiet=json_out):
        row = cli_rounds.rounds_row(parsed, delta, model, mode, cache)
    if ledger_url is not None:
        row |= {"deployment": deployment, "ledger_epsilon_spent": ledger_spent}
    kinds = ", ".join(
        f"{r['count']} x (n={r['n']}, k={r['mechanism']}, eps0={r['eps0']:g})"
        for r in row["round_list"][:6]
    ) + (", ..." if len(row["round_list"]) > 6 else "")
    tail = f" at delta = {delta:g} for {row['rounds']} round(s): {kinds}"
    _show(row, json_out, "epsilon", tail, _epsilon_gap(row))


@app.command()
def delta(
    n: N,
    k: K,
    eps0: EPS0,
    epsilon: Annotated[float, typer.Option(help="Target epsilon.")],
    rounds: ROUNDS = 1,
    method: METHOD = "tight",
    nx0: Annotated[int | None, typer.Option("--nx0", help="biswas: users holding x0.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """delta at a given epsilon (natural log given too: it may underflow)."""
    from shufflekit.accountant.registry import get_method
    from shufflekit.app.privacy_rows import delta_row

    mech = _mech(n, k, eps0)
    with working(f"delta ({method}, {rounds} round(s))", quiet=json_out):
        row = delta_row(get_method(method), mech, epsilon, rounds, nx0)
    lower = row.get("lower_bound_log_delta")
    tail = f" (log delta = {row['log_delta']:.6g}) at epsilon = {epsilon:g} for {rounds} round(s)"
    if lower is None:
        said = None
    elif lower == -math.inf:  # a bound, but not one to print as a number
        said = "delta >= 0 (the attack gives nothing above 0 at this epsilon)"
    else:
        said = f"log delta = {lower:.6g}"
    _show(row, json_out, "delta", tail, said)


@app.command(name="calibrate")
def calibrate_cmd(
    k: K,
    rounds: ROUNDS,
    epsilon: Annotated[float, typer.Option(help="Target total epsilon.")],
    delta: Annotated[float, typer.Option(help="Target total delta.")],
    n: Annotated[
        int | None,
        typer.Option("--n", parser=count, help="Users per round: find the largest eps0."),
    ] = None,
    eps0: Annotated[
        float | None, typer.Option("--eps0", help="Local epsilon: find the smallest n.")
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Largest eps0 for R rounds at n users (or smallest n for an eps0) meeting (epsilon, delta)."""
    from shufflekit.accountant import calibrate
    from shufflekit.accountant.core import Mechanism
    from shufflekit.app.privacy_rows import tight_lower_epsilon

    if (n is None) == (eps0 is None):
        refuse("give exactly one of --n (to find eps0) or --eps0 (to find n)")
    t0 = time.perf_counter()
    finding = "largest eps0" if n is not None else "smallest n"
    with working(f"searching the {finding} (composed tight accountant)", quiet=json_out):
        if n is not None:
            cal = calibrate.calibrate_eps0_detailed(n, k, rounds, epsilon, delta)
        else:
            assert eps0 is not None
            cal = calibrate.calibrate_n_detailed(eps0, k, rounds, epsilon, delta)
    found = Mechanism(
        n=n if n is not None else int(cal.value),
        k=k,
        eps0=cal.value if eps0 is None else eps0,
    )
    try:
        lower: float | None = tight_lower_epsilon(found, delta, rounds)
    except AccountantError:  # the lower bound is extra information: never fail the answer on it
        lower = None
    out = calibrate_json(cal, found, lower, time.perf_counter() - t0)
    if json_out:
        print_json(out)
        return
    what = "largest eps0" if cal.parameter == "eps0" else "smallest n"
    render.console.print(
        styled(
            f"{what}: ",
            (f"{cal.value:.6g}", "bold"),
            f" -> {rounds} round(s) spend epsilon {cal.achieved_epsilon:.6g} <= {epsilon:g} "
            f"at delta {delta:g} (tight, composed; {cal.evaluations} evaluations)",
        )
    )
    if cal.parameter == "eps0" and math.isinf(cal.bracket[1]):
        render.console.print(f"(the search's cap: every eps0 up to {cal.value:g} meets the target)")
    elif cal.parameter == "n" and cal.bracket[0] == 0.0:
        render.console.print(f"(the search's floor: even {cal.value:g} user(s) meet the target)")
    if lower is not None:
        render.console.print(f"lower bound (explicit attack): epsilon >= {lower:.6g}")
    render.console.print(f"({out['seconds']:.3g} s)")


def calibrate_json(
    cal: calibrate.Calibration, found: Mechanism, lower: float | None, seconds: float
) -> dict[str, Any]:
    """The calibration's own summary plus the fields every privacy command gives (`epsilon` is
    the upper bound the found parameter spends, `lower_bound` the attack's epsilon for it)."""
    from shufflekit.accountant.core import Soundness
    from shufflekit.accountant.numerics.logspace import log_of

    value = int(cal.value) if cal.parameter == "n" else cal.value
    return cal.summary() | {
        "value": value,
        "method": "tight",
        "soundness": Soundness.SOUND_UPPER.value,
        "epsilon": cal.achieved_epsilon,
        "delta": cal.delta,
        "log_delta": log_of(cal.delta),
        "lower_bound": lower,
        "n": found.n,
        "k": found.k,
        "eps0": found.eps0,
        "search_seconds": cal.seconds,
        "seconds": seconds,
    }


@app.command()
def compare(
    n: N,
    k: K,
    eps0: EPS0,
    delta: Annotated[float, typer.Option(help="Target delta.")],
    rounds: ROUNDS = 1,
    plot: Annotated[str | None, typer.Option(help="Draw delta(epsilon) to FILE.png.")] = None,
    variants: Annotated[
        bool,
        typer.Option(help="Also the printed variants (tail forms, closed forms); some are slow."),
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    """Every method side by side: epsilon, soundness label, lower bound, time."""
    from shufflekit.accountant.core import check_delta
    from shufflekit.accountant.numerics.logspace import log_of
    from shufflekit.accountant.registry import all_methods
    from shufflekit.app.privacy_rows import compare_rows

    mech = _mech(n, k, eps0)
    check_delta(delta)  # (each method would refuse it alone: a table of errors, exit 0)
    if plot is not None:  # checked before minutes of work, not after
        check_plot_path(plot)
    steps = len(all_methods(include_variants=variants))
    with progress_bar("epsilon of each method", steps, "steps", quiet=json_out) as update:
        rows = compare_rows(mech, delta, rounds, variants, progress=lambda i, name: update(i))
        plotted: list[str] | None = None
        if plot:
            from shufflekit.app.plots import plot_privacy_curves

            # epsilon 0 is an answer (biswas often gives it), None is not: test identity
            usable = [r["method"] for r in rows if r["epsilon"] is not None]
            update(steps, description="delta(epsilon) curves", total=steps + len(usable))
            plotted = plot_privacy_curves(
                plot, mech, rounds, usable, progress=lambda i, name: update(steps + i)
            )
    if json_out:
        print_json(
            {
                "n": n,
                "k": k,
                "eps0": eps0,
                "delta": delta,
                "log_delta": log_of(delta),
                "rounds": rounds,
                "plot": None if plot is None else {"path": plot, "methods": plotted},
                "rows": rows,
            }
        )
        return
    render.console.print(
        compare_table(rows, f"n={n}, k={k}, eps0={eps0:g}, delta={delta:g}, R={rounds}")
    )
    for r in rows:
        if r["note"]:
            render.console.print(styled((r["method"], "bold"), f": {r['note']}"))
    if plot:
        render.console.print(f"plot: {plot} ({', '.join(plotted or [])})", highlight=False)


def compare_table(rows: list[dict[str, Any]], title: str) -> Table:
    """The human table of `compare`: every method with epsilon, lower bound, label and time."""
    from rich.table import Table

    t = Table(title=title, pad_edge=False)  # 80 columns: method names are typed back
    for col in ("method", "epsilon", "lower bound", "label", "seconds"):
        t.add_column(col, no_wrap=True)
    for r in rows:
        eps = _fmt(r["epsilon"]) if r["status"] == "ok" else styled((r["status"], "dim"))
        t.add_row(
            r["method"],
            eps,
            _fmt(r["lower_bound"]),
            _label(r["soundness"]),
            f"{r['seconds']:.3f}",
        )
    return t
