"""The files an experiment leaves: its rows as CSV and the error-against-epsilon plot."""

from __future__ import annotations

import csv
import math
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


def _label(r: dict[str, Any]) -> str:
    if r["model"] == "shuffle":
        return f"shuffle+{r['estimator'].upper()}"
    if r["model"] == "central":
        return f"central Gaussian ({r['estimator']})"
    return "local k-RR (INV)"


def plot_utility(
    rows: Sequence[dict[str, Any]], path: str | Path, metric: str = "tv", title: str = ""
) -> Path:
    """Error (mean ± 1 std) vs epsilon, one line per model/estimator, log-log axes.

    One panel per (n, k); only rows with status "ok" are drawn.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r["status"] == "ok" and r["epsilon"] is not None]
    panels = sorted({(r["n"], r["k"]) for r in rows})
    ncols = min(len(panels), 3) or 1
    nrows = max(1, math.ceil(len(panels) / ncols))
    fig, axes = plt.subplots(nrows, ncols, figsize=(6.4 * ncols, 4.6 * nrows), squeeze=False)
    markers = "os^vD<>px*h"
    for ax, (n, k) in zip(axes.flat, panels, strict=False):
        sel = [r for r in ok if r["n"] == n and r["k"] == k]
        labels = list(dict.fromkeys(_label(r) for r in sel))
        for j, lab in enumerate(labels):
            pts = sorted((r for r in sel if _label(r) == lab), key=lambda r: r["epsilon"])
            x = np.array([r["epsilon"] for r in pts])
            y = np.array([r[f"{metric}_mean"] for r in pts])
            s = np.array([r[f"{metric}_std"] for r in pts])
            style = "--" if lab.startswith("central") else (":" if lab.startswith("local") else "-")
            ax.errorbar(
                x, y, yerr=s, marker=markers[j % len(markers)], ms=4, ls=style, capsize=2, label=lab
            )
            if j == 0 and pts[0]["model"] == "shuffle":  # the calibrated eps0 of each point
                for xi, yi, r in zip(x, y, pts, strict=True):
                    ax.annotate(
                        f"{r['eps0']:.2f}",
                        (xi, yi),
                        textcoords="offset points",
                        xytext=(0, 7),
                        ha="center",
                        fontsize=6,
                        color="0.3",
                    )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("epsilon (one round)")
        ax.set_ylabel(f"{metric.upper()} error (mean ± 1 sd)")
        delta = sel[0]["delta"] if sel else float("nan")
        ax.set_title(title or f"n = {n:,}, k = {k}, delta = {delta:g} (labels: shuffle eps0)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    fig.tight_layout()
    p = Path(path)
    fig.savefig(p, dpi=100)
    plt.close(fig)
    return p


def write_outputs(result: UtilityResult, out_dir: str | Path) -> dict[str, str]:
    """`utility.csv` and `utility.png` in out_dir (created if missing); returns their paths."""
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    c = write_csv(result.rows, d / "utility.csv")
    p = plot_utility(result.rows, d / "utility.png")
    return {"csv": str(c), "png": str(p)}
