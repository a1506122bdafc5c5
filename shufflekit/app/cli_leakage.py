"""`shufflekit leakage`: what one participant risks in a round, in numbers and in words.

Bayes vulnerability of one participant's value (QIF of the shuffle model, docs/leakage.md): an
outsider who sees the published counts, an insider who knows every other answer, k-RR alone, and
the smallest cohort that keeps the outsider within a margin of chance (`--max-excess`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from shufflekit.app import render
from shufflekit.app.cli_common import JsonOpt, check_plot_path, count, refuse
from shufflekit.app.render import print_json, progress_bar

if TYPE_CHECKING:  # the accountant (numpy, scipy) is imported when the command runs
    from shufflekit.accountant import leakage as lk

JSON_KEYS = (
    "prior_vulnerability",
    "outsider_vulnerability",
    "insider_vulnerability",
    "insider_exact",
    "local_only_vulnerability",
    "multiplicative_leakage",
    "additive_leakage",
    "statement",
)
"""What `--json` prints for `--n` (with `--max-excess` also `n` and `max_excess`, with
`--plot` also `plot`, the figure's path)."""


def leakage_json(r: lk.Leakage, statement: str) -> dict[str, Any]:
    """The documented JSON object of one cohort: exactly JSON_KEYS."""
    d = r.as_dict() | {"statement": statement}
    return {key: d[key] for key in JSON_KEYS}


def leakage(
    k: Annotated[int, typer.Option("--k", min=2, help="Values each participant may hold.")],
    eps0: Annotated[float, typer.Option("--eps0", help="Local epsilon of k-RR.")],
    n: Annotated[
        int | None, typer.Option("--n", parser=count, help="Participants in the round.")
    ] = None,
    max_excess: Annotated[
        float | None,
        typer.Option(
            "--max-excess", help="Without --n: the smallest n whose outsider is within X of 1/k."
        ),
    ] = None,
    delta: Annotated[
        float | None,
        typer.Option(
            "--delta", help="Also state the round's (epsilon, delta) (tight bound) in words."
        ),
    ] = None,
    plot: Annotated[
        str | None, typer.Option("--plot", help="Draw vulnerability against n to FILE.png.")
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """One participant's risk: chance of guessing their answer, for outsiders and insiders."""
    from shufflekit.accountant import leakage as lk
    from shufflekit.accountant.core import Mechanism
    from shufflekit.accountant.leakage_insider import MAX_EPS0
    from shufflekit.accountant.tight import tight_epsilon

    if not 0 < eps0 <= MAX_EPS0:
        refuse(f"--eps0 must be a number in (0, {MAX_EPS0:g}]")
    if (n is None) == (max_excess is None):
        refuse("give exactly one of --n (a cohort's risk) or --max-excess X (the smallest cohort)")
    if delta is not None and not 0 < delta < 1:
        refuse("--delta must be in (0, 1)")
    if plot is not None:
        check_plot_path(plot)
    if n is None:
        assert max_excess is not None
        with progress_bar("smallest cohort: evaluations", 30, quiet=json_out) as update:
            n = lk.min_cohort(k, eps0, max_excess, progress=update)
    r = lk.leakage_report(n, k, eps0)
    epsilon = None
    if delta is not None:
        epsilon = min(float(tight_epsilon(Mechanism(n=n, k=k, eps0=eps0), delta).epsilon), eps0)
    statement = lk.participant_statement(r, epsilon, delta)
    if plot:
        from shufflekit.app.plot_leakage import plot_leakage, plot_sizes

        total = len(plot_sizes(n, k))
        with progress_bar("plot: cohort sizes", total, quiet=json_out) as update:
            plot_leakage(plot, k, eps0, n, max_excess, progress=update)
    if json_out:
        out = leakage_json(r, statement)
        if max_excess is not None:
            out |= {"n": n, "max_excess": max_excess}
        print_json(out | ({"plot": plot} if plot else {}))  # as `privacy compare` names it
        return
    _print(r, statement, max_excess)
    if plot:
        render.console.print(f"plot: {plot}", highlight=False, markup=False)  # stdout, as compare


def _print(r: lk.Leakage, statement: str, max_excess: float | None) -> None:
    """The human view: one table of chances, the leakages, then the statement."""
    from rich.table import Table

    if max_excess is not None:
        render.console.print(
            f"smallest cohort with the outsider within {max_excess:g} of 1/{r.k}: n = {r.n:,}"
        )
    t = Table(title=f"n = {r.n:,}, k = {r.k}, eps0 = {r.eps0:g}: chance of guessing one answer")
    t.add_column("who guesses", no_wrap=True)
    t.add_column("probability", justify="right")
    t.add_column("x chance", justify="right")
    rows = [
        ("chance (prior)", r.prior_vulnerability),
        ("outsider: sees the published counts", r.outsider_vulnerability),
        (
            "insider: knows every other answer" + ("" if r.insider_exact else " (upper bound)"),
            r.insider_vulnerability,
        ),
        ("k-RR alone, no shuffle", r.local_only_vulnerability),
        ("shuffle alone, no noise (outsider)", r.shuffle_only_vulnerability),
    ]
    for name, v in rows:
        t.add_row(name, f"{v:.6g}", f"{v * r.k:.4g}")
    render.console.print(t)
    render.console.print(
        f"outsider leakage: multiplicative {r.multiplicative_leakage:.6g}, "
        f"additive {r.additive_leakage:.4g}"
    )
    render.console.print(statement, soft_wrap=True)
