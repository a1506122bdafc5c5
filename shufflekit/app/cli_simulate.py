"""`shufflekit simulate` (the fast statistical simulator) and `shufflekit experiment ...`.

`simulate` draws shuffled k-RR histograms from their exact law (no crypto, no transport; see
`shufflekit.simulate`) for a synthetic dataset or a CSV column, and denoises them.
`experiment utility` compares the shuffle, central and local models at equal (epsilon, delta);
`experiment individual` gives per-category errors (the seed paper's Table 4). The logic lives in
`shufflekit.experiment`; this module only parses options and prints.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from shufflekit.analyzer.names import ESTIMATORS
from shufflekit.app import render
from shufflekit.app.cli_common import JsonOpt, check_eps0, count, refuse
from shufflekit.app.experiment_options import (
    CALIBRATIONS,
    CENTRAL_READOUTS,
    DATASET_HELP,
    DEFAULT_EPSILONS,
    DEFAULT_REPETITIONS,
)
from shufflekit.app.render import print_json, progress_bar, styled, working
from shufflekit.app.state import writable

if TYPE_CHECKING:  # numpy, scipy, the accountant: imported by the commands when they run
    from rich.table import Table
    from rich.text import Text

    from shufflekit.app.datasets import CsvColumn, Dataset
    from shufflekit.app.experiment import UtilityConfig

IbuMaxIterOpt = Annotated[
    int, typer.Option(min=1, help="EM (ibu) stops after this many steps; hitting it is reported.")
]
IbuTolOpt = Annotated[
    float, typer.Option(help="EM (ibu) has converged when no frequency moves more in a step.")
]


# ----------------------------------------------------------------------------- simulate


def simulate(
    users: Annotated[
        int | None,
        typer.Option(parser=count, help="Users (default 10000; with --csv: the column's rows)."),
    ] = None,
    k: Annotated[
        int | None,
        typer.Option(
            min=2,
            help="Categories (default 10; --csv: its distinct values; probs: their count).",
        ),
    ] = None,
    eps0: Annotated[float, typer.Option(help="Local epsilon of k-RR (1e-6 to 700).")] = 2.0,
    rounds: Annotated[int, typer.Option(min=1, help="Rounds (every user re-randomises).")] = 1,
    dataset: Annotated[
        str | None, typer.Option(help=f"Synthetic dataset: {DATASET_HELP}; default normal.")
    ] = None,
    csv: Annotated[
        Path | None, typer.Option("--csv", help="CSV file with a header row (one user per row).")
    ] = None,
    column: Annotated[str | None, typer.Option(help="Column of --csv holding the values.")] = None,
    estimator: Annotated[str, typer.Option(help=f"One of {', '.join(ESTIMATORS)}.")] = "inv",
    n_boot: Annotated[
        int, typer.Option(min=0, help="Bootstrap replicates of non-INV estimators (0: none).")
    ] = 200,
    ibu_max_iter: IbuMaxIterOpt = 20_000,
    ibu_tol: IbuTolOpt = 1e-10,
    seed: Annotated[
        int, typer.Option(min=0, help="Seed of the population and of the simulation.")
    ] = 0,
    json_out: JsonOpt = False,
) -> None:
    """Simulate shuffled k-RR rounds from their exact law and estimate the distribution."""
    from shufflekit.app.datasets import CsvColumn, dataset_k, from_csv, make_dataset
    from shufflekit.app.simulate import check_size, run_simulation

    check_eps0(eps0)
    if estimator not in ESTIMATORS:
        refuse(f"unknown estimator {estimator!r}; choose one of {', '.join(ESTIMATORS)}")
    if not (math.isfinite(ibu_tol) and ibu_tol > 0):
        refuse(f"--ibu-tol must be a finite number > 0, got {ibu_tol}")
    if k is not None:
        check_size(k, rounds)
    source: Dataset | CsvColumn
    labels: tuple[str, ...]
    if csv is not None or column is not None:
        if csv is None or column is None:
            refuse("--csv and --column go together: give the file and the column to read")
        assert csv is not None and column is not None
        if dataset is not None:
            refuse("give either --dataset or --csv/--column, not both")
        col = from_csv(csv, column, k)
        if users is not None and users != col.n:
            refuse(f"--users {users} but column {column!r} of {csv} has {col.n} rows")
        source, n_users, k_eff, labels = col, col.n, col.k, col.labels
    else:
        name = dataset or "normal"
        k_eff = k if k is not None else (dataset_k(name) or 10)
        check_size(k_eff, rounds)
        ds = make_dataset(name, k_eff)
        source, n_users, labels = ds, users if users is not None else 10_000, ds.labels
    with progress_bar("estimating rounds", rounds, "rounds", quiet=json_out) as update:
        res = run_simulation(
            n_users,
            k_eff,
            eps0,
            rounds,
            source,
            estimator,
            seed,
            n_boot=n_boot,
            ibu_tol=ibu_tol,
            ibu_max_iter=ibu_max_iter,
            progress=lambda i, _t: update(i),
        )
    est = res.estimate
    out: dict[str, Any] = {
        "users": res.users,
        "k": res.k,
        "eps0": res.eps0,
        "rounds": res.rounds,
        "dataset": res.dataset,
        "estimator": res.estimator,
        "seed": res.seed,
        "labels": list(labels),
        "true_histogram": res.true_histogram.tolist(),
        "true_frequencies": res.true_frequencies.tolist(),
        "noisy_histogram": res.noisy_histogram.tolist(),
        "estimate": est.frequencies.tolist(),
        "estimate_counts": est.counts.tolist(),
        "stderr": est.stderr.tolist(),
        "ci_low": est.ci_low.tolist(),
        "ci_high": est.ci_high.tolist(),
        "confidence": est.confidence,
        "tv_distance": res.tv_distance,
        "tv_distances": res.tv_distances.tolist(),
        "converged": res.converged,
        "nonconverged_rounds": res.nonconverged_rounds,
        "iterations": res.iterations,
        "ibu_max_iter": ibu_max_iter,
        "ibu_tol": ibu_tol,
        "metrics": res.metrics,
        "seconds": res.seconds,
        "simulate_seconds": res.simulate_seconds,
        "estimate_seconds": res.estimate_seconds,
    }
    if isinstance(source, CsvColumn):
        out["csv"] = {
            "path": source.path,
            "column": source.column,
            "mapping": source.mapping,
            "skipped_blank": source.skipped_blank,
        }
    if json_out:
        print_json(out)
        return
    _print_simulation(out)


def _print_simulation(out: dict[str, Any]) -> None:
    from rich.table import Table

    csv_info = out.get("csv")
    if csv_info:
        m = Table(title=f"categories of column {csv_info['column']!r} ({csv_info['path']})")
        m.add_column("category", justify="right")
        m.add_column("value in the CSV")
        for value, cat in csv_info["mapping"].items():
            m.add_row(str(cat), value)
        render.console.print(m)
        if csv_info["skipped_blank"]:
            render.console.print(f"skipped {csv_info['skipped_blank']} blank cell(s)")
    t = Table(
        title=f"{out['users']:,} users, k = {out['k']}, eps0 = {out['eps0']:g}, "
        f"estimator {out['estimator']}, dataset {out['dataset']} (round 1 of {out['rounds']})"
    )
    for c in ("category", "label", "true freq", "shuffled count", "estimate", "± 1 s.e."):
        t.add_column(c, justify="right")
    for i, (lab, f, h, e, s) in enumerate(
        zip(
            out["labels"],
            out["true_frequencies"],
            out["noisy_histogram"],
            out["estimate"],
            out["stderr"],
            strict=True,
        )
    ):
        se = "-" if s is None or (isinstance(s, float) and math.isnan(s)) else f"{s:.4f}"
        t.add_row(str(i), lab, f"{f:.4f}", str(h), f"{e:.4f}", se)
    render.console.print(t)
    what = "mean over rounds" if out["rounds"] > 1 else "truth vs estimate"
    render.console.print(
        styled(f"total variation distance ({what}): ", (f"{out['tv_distance']:.5f}", "bold"))
    )
    render.console.print(f"simulated and estimated in {out['seconds']:.3f} s")
    if not out["converged"]:
        render.err_console.print(
            styled(
                ("warning:", "yellow"),
                f" EM ({out['estimator']}) did not converge in "
                f"{out['nonconverged_rounds']} of {out['rounds']} round(s) within "
                f"{out['ibu_max_iter']} steps (tol {out['ibu_tol']:g}); those estimates are the "
                "last EM step, not the maximum-likelihood point. Raise --ibu-max-iter, or use "
                "--estimator mle (the same maximum, computed exactly).",
            )
        )


# ----------------------------------------------------------------------------- experiment

T = TypeVar("T")

experiment_app = typer.Typer(
    help="Privacy-utility experiments: shuffle vs central vs local models.",
    no_args_is_help=True,
)


def _numbers(text: str | None, what: str, kind: Callable[[str], T], noun: str) -> tuple[T, ...]:
    """A comma-separated option parsed by `kind`; () if not given, refused if empty or bad."""
    if text is None:
        return ()
    parts = [x.strip() for x in text.split(",")]
    if parts == [""]:
        refuse(f"{what} is empty")
    if "" in parts:  # "1,,2" or a trailing comma: a value left out by mistake
        refuse(f"{what} has an empty entry: {text!r}")
    try:
        return tuple(kind(x) for x in parts)
    except ValueError:
        refuse(f"{what} must be comma-separated {noun}, got {text!r}")


def _floats(text: str | None, what: str) -> tuple[float, ...]:
    return _numbers(text, what, float, "numbers")


def _ints(text: str | None, what: str) -> tuple[int, ...]:
    return _numbers(text, what, int, "integers")


def _count_item(text: str) -> int:
    """One count of people in a list, written as `count` takes it (1e4, 10_000)."""
    try:
        return count(text)
    except typer.BadParameter as exc:
        raise ValueError(str(exc)) from None


def _counts(text: str | None, what: str) -> tuple[int, ...]:
    return _numbers(text, what, _count_item, "counts (10000, 10_000 or 1e4)")


def _names(text: str, what: str) -> tuple[str, ...]:
    vals = tuple(x.strip() for x in text.split(",") if x.strip())
    if not vals:
        refuse(f"{what} is empty")
    return vals


def _fmt(x: Any, spec: str = ".3g") -> str:
    return "-" if x is None else format(x, spec)


def _compact(x: float | None, digits: int = 3, width: int = 8) -> str:
    """x to `digits` significant digits in at most `width` characters if possible ("-": None).

    General format with the exponent's padding zeros dropped (1.23e-05 -> 1.23e-5); if that is
    still too wide (0.0001234), scientific notation with the same digits.
    """
    if x is None:
        return "-"

    def tidy(text: str) -> str:
        mant, sep, exp = text.partition("e")
        return f"{mant}e{exp[0]}{exp[1:].lstrip('0') or '0'}" if sep else text

    text = tidy(format(x, f".{digits}g"))
    if len(text) > width:
        text = min(text, tidy(format(x, f".{digits - 1}e")), key=len)
    return text


@experiment_app.command()
def utility(
    n: Annotated[int, typer.Option(parser=count, help="Users (unless --ns).")] = 100_000,
    k: Annotated[
        int | None,
        typer.Option(min=2, help="Categories unless --ks (default 10; probs: its length)."),
    ] = None,
    delta: Annotated[float, typer.Option(help="delta of every model (0: see the docs).")] = 1e-6,
    epsilons: Annotated[
        str | None,
        typer.Option(
            help="Target epsilons, comma-separated (default "
            f"{','.join(f'{e:g}' for e in DEFAULT_EPSILONS)} unless --eps0-values)."
        ),
    ] = None,
    eps0_values: Annotated[
        str | None,
        typer.Option(help="Points given by eps0 instead: epsilon = the tight accountant's."),
    ] = None,
    ns: Annotated[str | None, typer.Option(help="Sweep n too: comma-separated.")] = None,
    ks: Annotated[str | None, typer.Option(help="Sweep k too: comma-separated.")] = None,
    repetitions: Annotated[int, typer.Option(min=1, help="Rounds per point.")] = (
        DEFAULT_REPETITIONS
    ),
    dataset: Annotated[str, typer.Option(help=f"Dataset: {DATASET_HELP}.")] = "normal",
    estimators: Annotated[
        str, typer.Option(help="Shuffle-model estimators, comma-separated.")
    ] = ",".join(ESTIMATORS),
    central: Annotated[
        str, typer.Option(help="Central read-outs: raw (paper) and/or project.")
    ] = ",".join(CENTRAL_READOUTS),
    calibration: Annotated[
        str,
        typer.Option(help="eps0 search: tight (one-round bound) or composed (PLD; slow)."),
    ] = "tight",
    ibu_max_iter: IbuMaxIterOpt = 20_000,
    ibu_tol: IbuTolOpt = 1e-10,
    seed: Annotated[int, typer.Option(min=0, help="Seed of every random stream.")] = 0,
    out: Annotated[
        Path | None, typer.Option("--out", help="Write utility.csv and utility.png here.")
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Error vs epsilon of shuffle (+ each estimator), central Gaussian and local k-RR."""
    from shufflekit.app.datasets import dataset_k
    from shufflekit.app.experiment import UtilityConfig, utility_experiment
    from shufflekit.app.experiment_report import write_outputs

    eps = _floats(epsilons, "--epsilons")
    e0s = tuple(check_eps0(e, "--eps0-values") for e in _floats(eps0_values, "--eps0-values"))
    if not eps and not e0s:
        eps = DEFAULT_EPSILONS
    if calibration not in CALIBRATIONS:
        refuse(f"unknown calibration {calibration!r}; choose one of {', '.join(CALIBRATIONS)}")
    k_default = k if k is not None else (dataset_k(dataset) or 10)
    cfg = UtilityConfig(
        epsilons=eps,
        eps0_values=e0s,
        ns=_counts(ns, "--ns") or (n,),
        ks=_ints(ks, "--ks") or (k_default,),
        delta=delta,
        repetitions=repetitions,
        dataset=dataset,
        estimators=_names(estimators, "--estimators"),
        central=_names(central, "--central"),
        seed=seed,
        calibration=calibration,
        ibu_tol=ibu_tol,
        ibu_max_iter=ibu_max_iter,
    )
    cfg.validate()
    if out is not None:  # before the sweep: found after it, its results were thrown away
        writable(Path(out))
    with progress_bar("utility", len(cfg.points()), "points", quiet=json_out) as update:
        res = utility_experiment(cfg, progress=lambda i, _t, d: update(i, description=d))
    try:
        files = write_outputs(res, out) if out is not None else {}
    except OSError as exc:
        refuse(f"cannot write the output files: {exc}")
    if json_out:
        print_json(res.summary() | {"files": files})
        return
    render.console.print(utility_table(res.rows, cfg))
    notes: dict[str, list[str]] = {}
    for r in res.rows:
        if r["note"]:
            where = f"{r['point']} {r['model']}"
            if r["model"] == "shuffle" and r.get("nonconverged"):
                where += f"+{r['estimator']}"
            if where not in notes.setdefault(r["note"], []):
                notes[r["note"]].append(where)
    for note, wheres in notes.items():
        render.console.print(styled((f"{'; '.join(wheres)}:", "yellow"), f" {note}"))
    bad = [r for r in res.rows if r.get("nonconverged")]
    if bad:
        total = sum(int(r["nonconverged"]) for r in bad)
        render.err_console.print(
            styled(
                ("warning:", "yellow"),
                f" EM (ibu) hit its cap of {cfg.ibu_max_iter} steps in {total} repetition(s) "
                f"over {len(bad)} row(s) (column nonconverged); raise --ibu-max-iter or compare "
                "with the exact MLE (mle).",
            )
        )
    if files:
        render.console.print(f"wrote {files['csv']} and {files['png']}")
    render.console.print(f"{len(cfg.points())} point(s) in {res.seconds:.1f} s")


def utility_table(rows: list[dict[str, Any]], cfg: UtilityConfig) -> Table:
    """The human table of `experiment utility`, at most 80 characters wide.

    Numbers take at most 8 characters (errors to 3 significant digits, epsilon and eps0 to 4)
    so nothing is cut at 80 columns; a sweep over n or k adds n and k and leaves out the L2
    and max errors (they are in --json and the CSV).
    """
    from rich import box
    from rich.table import Table

    one = len(cfg.ns) == 1 and len(cfg.ks) == 1
    where = f"n = {cfg.ns[0]:,}, k = {cfg.ks[0]}, " if one else ""
    t = Table(
        title=f"utility: {where}delta = {cfg.delta:g}, {cfg.repetitions} repetitions, "
        f"dataset {cfg.dataset}",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        padding=(0, 0, 0, 1),  # one space plus the box's divider between columns
    )
    cols = ["epsilon", *([] if one else ["n", "k"]), "model", "estimator", "eps0", "TV mean"]
    cols += ["TV sd", *(["L2 mean", "max mean"] if one else [])]
    for c in cols:
        t.add_column(c, justify="right", no_wrap=True)
    for r in rows:
        ok = r["status"] == "ok"
        errs: list[str | Text] = [_compact(r["tv_mean"]) if ok else styled((r["status"], "yellow"))]
        errs += [_compact(r["tv_std"])]
        if one:
            errs += [_compact(r["l2_mean"]), _compact(r["max_mean"])]
        t.add_row(
            _compact(r["epsilon"], 4),
            *([] if one else [str(r["n"]), str(r["k"])]),
            r["model"],
            r["estimator"],
            _compact(r["eps0"], 4),
            *errs,
        )
    return t


@experiment_app.command()
def individual(
    n: Annotated[int, typer.Option(parser=count, help="Users.")] = 100_000,
    k: Annotated[
        int | None, typer.Option(min=2, help="Categories (default 15; probs: its length).")
    ] = None,
    eps0: Annotated[float, typer.Option(help="Local epsilon of k-RR.")] = 4.0,
    categories: Annotated[
        str, typer.Option(help="Categories x0 (0-based; the paper's x0 minus 1).")
    ] = "0,2,4,6",
    delta: Annotated[float, typer.Option(help="delta of the Gaussian (0: none exists).")] = 1e-6,
    epsilon: Annotated[
        float | None,
        typer.Option(help="epsilon of the Gaussian (default: the shuffle round's tight one)."),
    ] = None,
    repetitions: Annotated[int, typer.Option(min=1, help="Repetitions.")] = DEFAULT_REPETITIONS,
    dataset: Annotated[str, typer.Option(help=f"Dataset: {DATASET_HELP}.")] = "normal",
    seed: Annotated[int, typer.Option(min=0, help="Seed.")] = 0,
    json_out: JsonOpt = False,
) -> None:
    """Per-category error |pi_hat_x0 - pi_x0|: shuffle+INV vs central Gaussian (Table 4)."""
    from rich.table import Table

    from shufflekit.app.datasets import dataset_k
    from shufflekit.app.individual import individual_utility

    check_eps0(eps0)
    if epsilon is not None and not (math.isfinite(epsilon) and epsilon > 0):
        refuse(f"--epsilon must be a finite number > 0, got {epsilon:g}")
    with working("per-category errors (shuffle+INV and Gaussian)", quiet=json_out):
        res = individual_utility(
            n,
            k if k is not None else (dataset_k(dataset) or 15),
            eps0,
            _ints(categories, "--categories"),
            delta,
            epsilon,
            repetitions,
            dataset,
            seed,
        )
    if json_out:
        print_json(res.summary())
        return
    sig = "-" if res.sigma is None else f"{res.sigma:.4g}"
    t = Table(
        title=f"n = {res.n:,}, k = {res.k}, eps0 = {res.eps0:g}; Gaussian at epsilon = "
        f"{res.epsilon:.4g}, delta = {res.delta:g} (sigma {sig}); {res.repetitions} repetitions"
    )
    for c in (
        "x0 (paper)",
        "true freq",
        "shuffle+INV first",
        "mean ± sd",
        "Gaussian first",
        "mean ± sd",
    ):
        t.add_column(c, justify="right")
    for r in res.rows:
        g = (
            (
                _fmt(r["gaussian_first"], ".2e"),
                f"{r['gaussian_mean']:.2e} ± {r['gaussian_std']:.1e}",
            )
            if r["gaussian_mean"] is not None
            else ("-", "-")
        )
        t.add_row(
            str(r["x0_paper"]),
            f"{r['true_frequency']:.4f}",
            f"{r['shuffle_inv_first']:.2e}",
            f"{r['shuffle_inv_mean']:.2e} ± {r['shuffle_inv_std']:.1e}",
            *g,
        )
    render.console.print(t)
    if res.note:
        render.console.print(res.note, style="yellow")


__all__ = ["experiment_app", "individual", "simulate", "utility", "utility_table"]
