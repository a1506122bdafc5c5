"""The leakage plot: what one participant risks against the cohort size n, for one k and eps0."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from shufflekit.accountant import leakage as lk
from shufflekit.accountant.leakage_insider import insider_vulnerability

PLOT_INSIDER_WORK = 2e6
"""Exact insider work per plotted point (beyond it the point is the sound bound, drawn dashed)."""


def plot_sizes(n: int | None, k: int) -> list[int]:
    """About 40 cohort sizes from 1 to past n (log-spaced; at most 1e6 for k >= 3: cost)."""
    top = max(1000, 10 * (n or 100))
    top = min(top, 10**9 if k == 2 else 10**6)
    return sorted({int(x) for x in np.geomspace(1, top, 40).round()} | ({n} if n else set()))


def least_so_far(insider: list[float]) -> np.ndarray:
    """The insider's risk at increasing n as drawn: the least value so far. One more
    participant whose answer the insider knows is a post-processing of the smaller round (the
    insider can add that report itself), so the risk never grows with n, and the least value
    so far, exact or bound, is a sound bound too (the bound alone jumped above the exact
    values where it took over)."""
    return np.minimum.accumulate(np.asarray(insider, dtype=float))


def plot_leakage(
    path: str,
    k: int,
    eps0: float,
    n: int | None = None,
    max_excess: float | None = None,
    progress: Callable[[int], None] | None = None,
) -> int:
    """Vulnerabilities against n (log axis) to `path` (PNG): outsider, insider (solid where
    exact, dashed where the bound), shuffle alone, k-RR alone and the 1/k line. Returns the
    number of sizes drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = plot_sizes(n, k)
    out, shuf, ins_v, ins_exact = [], [], [], []
    for i, m in enumerate(sizes):
        out.append(lk.outsider_vulnerability(m, k, eps0))
        shuf.append(lk.shuffle_only_vulnerability(m, k))
        v, exact = insider_vulnerability(m, k, eps0, max_work=PLOT_INSIDER_WORK)
        ins_v.append(v)
        ins_exact.append(exact)
        if progress is not None:
            progress(i + 1)
    x = np.array(sizes, dtype=float)
    exact_mask = np.array(ins_exact)
    ins = least_so_far(ins_v)
    chance = 1.0 / k
    tiny = 1e-12  # excesses below it are drawn at it (the log axis has no zero)

    def excess(v: object) -> np.ndarray:
        return np.maximum(np.asarray(v, dtype=float) - chance, tiny)

    fig, ax = plt.subplots(figsize=(7.5, 6.2))
    local = lk.local_only_vulnerability(k, eps0)
    ax.axhline(
        local - chance,
        color="tab:red",
        lw=1.2,
        ls=":",
        label=f"k-RR alone (no shuffle): {local:.4g}",
    )
    ax.plot(x, excess(shuf), color="tab:gray", lw=1.2, label="shuffle alone (no noise), outsider")
    ax.plot(
        np.where(exact_mask, x, np.nan),
        np.where(exact_mask, excess(ins), np.nan),
        color="tab:orange",
        lw=1.8,
        label="insider (knows every other answer), exact worst case",
    )
    if not exact_mask.all():
        first = int(np.argmin(exact_mask)) if exact_mask.any() else 0
        ax.plot(
            x[max(first - 1, 0) :],
            excess(ins[max(first - 1, 0) :]),
            color="tab:orange",
            lw=1.5,
            ls="--",
            label="insider, sound upper bound (the least at any n so far)",
        )
    ax.plot(x, excess(out), color="black", lw=2.2, label="outsider (sees the published counts)")
    if max_excess is not None:
        ax.axhline(max_excess, color="tab:blue", lw=0.8, ls="--", label=f"1/k + {max_excess:g}")
    if n is not None:
        at = sizes.index(n)
        ax.axvline(
            n,
            color="tab:green",
            lw=0.9,
            ls="-.",
            label=f"n = {n:,}: outsider {out[at]:.4g}, insider {ins[at]:.4g}",
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("participants n (log scale)")
    ax.set_ylabel(f"chance of guessing one value, minus chance 1/k = {chance:.4g}")
    ax.set_title(f"Bayes vulnerability of one participant above chance: k = {k}, eps0 = {eps0:g}")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=1)
    fig.tight_layout()
    fig.savefig(path, dpi=120, format="png", bbox_inches="tight")
    plt.close(fig)
    return len(sizes)
