"""The files an experiment leaves: its rows as CSV and the error-against-epsilon plot."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from shufflekit.app.experiment import (
    ROW_FIELDS,
    UtilityResult,
)


def write_csv(rows: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """Rows as CSV with the `ROW_FIELDS` columns (None written as an empty cell)."""
    p = Path(path)
    with p.open("w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=list(ROW_FIELDS), extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({f: ("" if r.get(f) is None else r.get(f)) for f in ROW_FIELDS})
    return p


ESTIMATOR_NAMES = {
    "inv": "INV (unbiased inversion)",
    "clip": "CLIP (inversion, clipped at 0)",
    "project": "PROJECT (inversion onto the simplex)",
    "ibu": "IBU (EM, iterative Bayesian update)",
    "mle": "MLE (exact maximum likelihood)",
}
"""Human names of the shuffle model's estimators, for legends."""

_STYLES = {  # (colour, line style, marker, filled): distinguishable in colour and in grey
    "shuffle": ("tab:blue", "-", "o", True),
    "central raw": ("tab:orange", "--", "s", True),
    "central project": ("tab:green", "-.", "^", False),
    "local": ("0.35", ":", "D", True),
}
_ESTIMATOR_STYLES = [
    ("tab:blue", "-", "o"),
    ("tab:red", "--", "s"),
    ("tab:green", "-.", "^"),
    ("tab:purple", ":", "v"),
    ("black", (0, (5, 1)), "x"),
]


def _label(r: dict[str, Any]) -> str:
    """A row's line in the error panel, in words (the shuffle line is its first estimator)."""
    if r["model"] == "shuffle":
        return f"shuffle model, {ESTIMATOR_NAMES.get(r['estimator'], r['estimator'])}"
    if r["model"] == "central":
        how = "projected onto the simplex" if r["estimator"] == "project" else "raw counts"
        return f"central model: Gaussian noise, {how}"
    return "local model: k-RR alone, no shuffle (INV: off the simplex, may pass 1)"


def _style(r: dict[str, Any]) -> tuple[str, Any, str, bool]:
    key = r["model"] if r["model"] != "central" else f"central {r['estimator']}"
    return _STYLES.get(key, ("tab:brown", "-", "*", True))


def _series(rows: Sequence[dict[str, Any]], metric: str) -> tuple[Any, Any, Any, list[Any]]:
    """x = epsilon, mean, sd of `metric`, and the rows, sorted by epsilon."""
    pts = sorted(rows, key=lambda r: r["epsilon"])
    x = np.array([r["epsilon"] for r in pts], dtype=float)
    y = np.array([r[f"{metric}_mean"] for r in pts], dtype=float)
    s = np.array([r[f"{metric}_std"] for r in pts], dtype=float)
    return x, y, s, pts


def _epsilon_ticks(ax: Any, epsilons: list[float]) -> None:
    """Ticks at the epsilons of the sweep, written plainly (the log axis wrote 0.3 and 0.4 as
    "3x10^-1" and "4x10^-1", run together); a long sweep keeps the log axis's own ticks."""
    if len(epsilons) > 12:
        return
    ax.set_xticks(epsilons, [f"{e:g}" for e in epsilons])
    ax.minorticks_off()


def _error_panel(ax: Any, sel: list[dict[str, Any]], metric: str, reps: str) -> None:
    """Error against epsilon of the three models (shuffle with its first estimator), log-log."""
    shuffle_est = next((r["estimator"] for r in sel if r["model"] == "shuffle"), None)
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in sel:
        if r["model"] == "shuffle" and r["estimator"] != shuffle_est:
            continue
        groups.setdefault(_label(r), []).append(r)
    for lab, rows in groups.items():
        x, y, s, pts = _series(rows, metric)
        colour, ls, marker, filled = _style(pts[0])
        ax.errorbar(
            x,
            y,
            yerr=s,
            color=colour,
            ls=ls,
            marker=marker,
            ms=5,
            mfc=colour if filled else "white",
            capsize=2,
            lw=1.4,
            label=lab,
        )
        if pts[0]["model"] == "shuffle":  # the calibrated eps0 of each point
            for xi, yi, r in zip(x, y, pts, strict=True):
                ax.annotate(
                    f"{r['eps0']:.1f}",
                    (xi, yi),
                    textcoords="offset points",
                    xytext=(0, 9),
                    ha="center",
                    fontsize=7,
                    color=colour,
                    zorder=20,  # over the error bars' caps and the other models' markers
                    bbox={"boxstyle": "round,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.8},
                )
    ax.set_xscale("log")
    ax.set_yscale("log")
    top = max(r[f"{metric}_mean"] + r[f"{metric}_std"] for r in sel)
    ax.set_ylim(top=top * 40)  # headroom for the legend, above every curve
    ax.set_ylabel(f"{_METRICS.get(metric, metric)} error of the estimate\n(mean ± 1 sd, {reps})")
    ax.set_title(
        "error against the privacy budget\n(numbers over the shuffle line: its local eps0)",
        fontsize=10,
    )
    ax.legend(fontsize=7, loc="upper right")


def _estimator_panel(ax: Any, sel: list[dict[str, Any]], metric: str) -> bool:
    """Each shuffle estimator's error relative to the first one's (INV by default), linear y:
    on the error panel they lie on top of each other. False if there is only one estimator."""
    shuffle = [r for r in sel if r["model"] == "shuffle"]
    names = list(dict.fromkeys(r["estimator"] for r in shuffle))
    if len(names) < 2:
        return False
    ref = {r["epsilon"]: r[f"{metric}_mean"] for r in shuffle if r["estimator"] == names[0]}
    for j, name in enumerate(names):
        rows = [r for r in shuffle if r["estimator"] == name and ref.get(r["epsilon"])]
        x, y, _s, pts = _series(rows, metric)
        ratio = y / np.array([ref[r["epsilon"]] for r in pts])
        colour, ls, marker = _ESTIMATOR_STYLES[j % len(_ESTIMATOR_STYLES)]
        ax.plot(
            x,
            ratio,
            color=colour,
            ls=ls,
            marker=marker,
            ms=5 + (len(names) - j),  # earlier ones larger, so coinciding markers all show
            mfc="none",
            lw=1.3,
            label=ESTIMATOR_NAMES.get(name, name),
        )
    ax.axhline(1.0, color="0.6", lw=0.8)
    ax.set_xscale("log")
    # ratios equal to 1 within 1e-9 were drawn on an axis labelled "1e-9 + 1", as if the
    # differences meant something: at least +-1% shown, and the values written whole
    lo, hi = ax.get_ylim()
    ax.set_ylim(min(lo, 0.99), max(hi, 1.01))
    ax.ticklabel_format(axis="y", useOffset=False)
    first = names[0].upper()
    ax.set_ylabel(f"{_METRICS.get(metric, metric)} error / {first}'s error (1 = same)")
    ax.set_title(f"shuffle model: estimators compared with {first}", fontsize=10)
    ax.legend(fontsize=7, loc="best")
    return True


_METRICS = {"tv": "total variation", "l1": "L1", "l2": "L2", "max": "largest per-category"}


def plot_utility(
    rows: Sequence[dict[str, Any]], path: str | Path, metric: str = "tv", title: str = ""
) -> Path:
    """`utility_figure` written to `path` (PNG)."""
    fig = utility_figure(rows, metric, title)  # selects the Agg backend first
    import matplotlib.pyplot as plt

    p = Path(path)
    fig.savefig(p, dpi=100)
    plt.close(fig)
    return p


def utility_figure(rows: Sequence[dict[str, Any]], metric: str = "tv", title: str = "") -> Any:
    """A matplotlib Figure. Per (n, k): error (mean ± 1 sd) against epsilon of the shuffle,
    central and local models (log-log), and beside it each shuffle estimator's error relative
    to the first's, where their differences (often under 1%) can be seen. Only rows with
    status "ok" are drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r["status"] == "ok" and r["epsilon"] is not None]
    panels = sorted({(r["n"], r["k"]) for r in rows})
    several = len({r["estimator"] for r in ok if r["model"] == "shuffle"}) > 1
    ncols = 2 if several else 1
    fig, axes = plt.subplots(
        len(panels) or 1, ncols, figsize=(6.2 * ncols, 4.9 * max(1, len(panels))), squeeze=False
    )
    for row_axes, (n, k) in zip(axes, panels, strict=False):
        sel = [r for r in ok if r["n"] == n and r["k"] == k]
        if not sel:
            continue
        reps = f"{sel[0]['repetitions']} repetitions" if sel[0].get("repetitions") else "runs"
        delta = sel[0]["delta"]
        _error_panel(row_axes[0], sel, metric, reps)
        if several and not _estimator_panel(row_axes[1], sel, metric):
            row_axes[1].set_visible(False)
        for ax in row_axes:
            ax.set_xlabel(f"epsilon of one round (at delta = {delta:g})")
            ax.grid(True, which="both", alpha=0.3)
            _epsilon_ticks(ax, sorted({r["epsilon"] for r in sel}))
        if len(panels) > 1:
            row_axes[0].annotate(
                f"n = {n:,} users, k = {k} categories",
                (0.0, 1.22),
                xycoords="axes fraction",
                fontsize=10,
                weight="bold",
            )
    where = (
        f"n = {panels[0][0]:,} users, k = {panels[0][1]} categories, " if len(panels) == 1 else ""
    )
    dataset = ok[0].get("dataset", "") if ok else ""
    fig.suptitle(
        title
        or f"How close is the estimated distribution to the truth? {where}dataset {dataset}".rstrip(
            ", "
        ),
        fontsize=11,
    )
    fig.tight_layout()
    return fig


def write_outputs(result: UtilityResult, out_dir: str | Path) -> dict[str, str]:
    """`utility.csv` and `utility.png` in out_dir (created if missing); returns their paths."""
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    c = write_csv(result.rows, d / "utility.csv")
    p = plot_utility(result.rows, d / "utility.png")
    return {"csv": str(c), "png": str(p)}
