"""Plots for reports: privacy curves delta(epsilon) of several methods."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from shufflekit.accountant import composition, tight
from shufflekit.accountant.core import Mechanism
from shufflekit.accountant.registry import get_method
from shufflekit.base.errors import AccountantError

FLOOR_LOG10 = -40.0
"""Curves stop below this log10 delta: nobody reads them there, and evaluating them is slow."""

POINTS = 60
"""Epsilon grid size; log-spaced over [top / 1000, top] so small amplified epsilons are seen."""


def _log10(ld: float) -> float:
    """log10 from a natural log, NaN (a gap in the line) where delta is 0."""
    return ld / math.log(10) if ld > -math.inf else math.nan


def _curve(
    name: str, mech: Mechanism, rounds: int, eps: npt.NDArray[np.float64]
) -> tuple[list[float], list[float], int, int]:
    """log10 delta of method `name` over `eps` (and, for `tight`, of its attack lower bound),
    at how many points the method could not answer (not applicable, not composable), and at
    how many its composed delta was below ten times the composition's numerical slack.

    delta(eps) is non-increasing, so evaluation stops once the curve is below FLOOR_LOG10.
    """
    m = get_method(name)
    upper: list[float] = []
    lower: list[float] = []
    attack = None
    if name == "tight" and rounds > 1:
        try:
            attack = composition.compose_lower([tight.attack_pld(mech)], counts=[rounds])
        except AccountantError:
            attack = None
    composed = None  # the rounds' composition, once: its slack decides what it certifies
    if rounds > 1 and m.pld is not None:
        with contextlib.suppress(AccountantError):
            composed = composition.compose([m.pld(mech)], counts=[rounds])
    done_up = done_lo = False  # the curve reached the floor (errors do not count)
    failures = uncertified = 0
    for e in map(float, eps):
        ld = lo = -math.inf
        failed = False
        try:
            if done_up and (done_lo or name != "tight"):
                pass
            elif rounds == 1:
                res = m.delta(mech, e)
                ld = res.log_delta
                lo = res.lower_log_delta if res.lower_log_delta is not None else -math.inf
            elif composed is not None:
                ld = composed.log_delta(e)
                lo = attack.log_delta(e) if attack is not None else -math.inf
                # below ten times its numerical slack a delta is not certified (the CLI and
                # the ledger answer there by another method): drawn, it was a false floor
                if not composed.certifies(ld):
                    uncertified += 1
                    ld = -math.inf
            else:  # a closed form without a privacy loss distribution: not composable
                failed = True
        except AccountantError:  # e.g. a closed form outside its range at this epsilon: a gap
            failed = True
        done_up = done_up or (not failed and not _log10(ld) > FLOOR_LOG10)
        done_lo = done_lo or (not failed and not _log10(lo) > FLOOR_LOG10)
        failures += failed
        upper.append(_log10(ld))
        lower.append(_log10(lo))
    return upper, lower, failures, uncertified


METHOD_NAMES = {
    "tight": "tight (exact worst case, this accountant)",
    "blanket-strong": "blanket, strong (Koskela et al., Thm 8)",
    "blanket-weak": "blanket, weak (Koskela et al., Thm 10)",
    "clones": "clones (Feldman, McMillan, Talwar)",
    "erlingsson": "Erlingsson et al. 2019, closed form",
    "balle-closed": "Balle et al. 2019, closed form",
    "biswas": "Biswas et al. as printed",
    "biswas-corrected": "Biswas et al., corrected",
    "ldp": "local DP of one report (no shuffle)",
}
"""Legend names of the registry's methods (the CLI's --method names stay in brackets)."""

SOUNDNESS_WORDS = {
    "SOUND_UPPER": "upper bound",
    "LOWER_BOUND": "lower bound",
    "NOT_A_GUARANTEE": "NOT a guarantee",
}

_STYLES = [  # (colour, dashes, marker): no two curves alike in colour, in grey or in shape
    ("tab:blue", "-", "o"),
    ("tab:orange", (0, (6, 2)), "s"),
    ("tab:green", "-.", "^"),
    ("tab:red", (0, (2, 1)), "v"),
    ("tab:purple", (0, (8, 2, 2, 2)), "D"),
    ("tab:brown", "--", "P"),
    ("tab:pink", ":", "X"),
    ("tab:olive", (0, (4, 1, 1, 1, 1, 1)), "*"),
    ("tab:cyan", "-", "h"),
    ("tab:gray", (0, (1, 1)), "<"),  # --variants draws up to 12 curves beside tight
    ("gold", (0, (5, 1, 1, 1)), ">"),
    ("navy", (0, (3, 1, 3, 3)), "p"),
    ("teal", (0, (10, 3)), "d"),
]


def _same_as(mine: list[float], others: dict[str, list[float]]) -> str | None:
    """The first of `others` whose curve equals `mine` (to 1e-6 where drawn), or None."""
    a = np.asarray(mine)
    for other, ys in others.items():
        b = np.asarray(ys)
        both = np.isfinite(a) & np.isfinite(b)
        same_gaps = np.array_equal(np.isfinite(a), np.isfinite(b))
        if both.any() and same_gaps and np.allclose(a[both], b[both], rtol=0, atol=1e-6):
            return other
    return None


def plot_privacy_curves(
    path: str,
    mech: Mechanism,
    rounds: int,
    methods: list[str],
    progress: Callable[[int, str], None] | None = None,
) -> list[str]:
    """`privacy_figure` written to `path` (PNG); returns the methods drawn, in order."""
    fig, drawn = privacy_figure(mech, rounds, methods, progress)  # selects the Agg backend first
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)
    return drawn


def privacy_figure(
    mech: Mechanism,
    rounds: int,
    methods: list[str],
    progress: Callable[[int, str], None] | None = None,
) -> tuple[Any, list[str]]:
    """delta(epsilon) of each method on a log-log plot down to 1e-40 (a matplotlib Figure);
    `progress(done, method)` is called as each method's curve is computed (the slow part).

    Every curve has its own colour, dash pattern and markers (shifted along the curve, so
    coinciding curves still show each marker); a curve equal to another one's says so in the
    legend. `tight` is drawn last (on top), thick and black, with its attack lower bound
    dashed. Returns the methods drawn, in order.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    top = mech.eps0 * rounds
    eps = np.geomspace(top / 1000, top, POINTS)
    fig, (ax, key) = plt.subplots(
        2, 1, figsize=(8.5, 8.2), gridspec_kw={"height_ratios": [3.0, 1.25]}
    )
    order = [m for m in methods if m != "tight"] + [m for m in methods if m == "tight"]
    uppers: dict[str, list[float]] = {}
    lowers: dict[str, list[float]] = {}
    failed: dict[str, int] = {}
    slack: dict[str, int] = {}
    for i, name in enumerate(order, 1):
        uppers[name], lowers[name], failed[name], slack[name] = _curve(name, mech, rounds, eps)
        if progress is not None:
            progress(i, name)
    drawn: list[str] = []
    for j, name in enumerate(order):
        m = get_method(name)
        upper = uppers[name]
        label = f"{METHOD_NAMES.get(name, name)} [{name}]: "
        label += SOUNDNESS_WORDS.get(m.soundness.name, m.soundness.name.lower())
        # tight is drawn last, on top: a curve equal to it would hide under it unsaid
        others = {n: uppers[n] for n in order[:j]} | (
            {"tight": uppers["tight"]} if "tight" in uppers and name != "tight" else {}
        )
        twin = _same_as(upper, others)
        if twin is not None:
            label += f"; same curve as [{twin}] here"
        if failed[name] == len(eps):
            label += "; cannot answer here (not applicable or not composable)"
        elif not any(y > FLOOR_LOG10 for y in upper):
            label += f"; no delta above 1e{FLOOR_LOG10:.0f}"
        elif failed[name]:
            label += f"; not applicable at {failed[name]} of {len(eps)} epsilons (gaps)"
        if slack[name]:  # the CLI answers there by repeated squaring or Renyi: not this curve
            label += "; stops where numerics pass delta / 10"
        if name == "tight":
            ax.plot(eps, upper, color="black", lw=2.6, zorder=10, label=label)
            ax.plot(
                eps,
                lowers[name],
                color="magenta",  # no other curve's colour
                lw=1.1,
                ls=(0, (3, 2)),
                zorder=11,
                label="tight: its explicit attack (lower bound; the truth lies between; where "
                "it meets the bound it runs along it)",
            )
        else:
            colour, dashes, marker = _STYLES[j % len(_STYLES)]
            ax.plot(
                eps,
                upper,
                color=colour,
                ls=dashes,
                lw=1.5,
                marker=marker,
                ms=5,
                mfc="none",
                markevery=(j % 6, 6),  # shifted per curve: coinciding curves show all markers
                zorder=2 + j,
                label=label,
            )
        drawn.append(name)
    ax.set_xscale("log")
    ax.set_ylim(bottom=FLOOR_LOG10, top=0.5)
    ax.set_xlabel("epsilon (one round)" if rounds == 1 else f"epsilon ({rounds} rounds composed)")
    ax.set_ylabel("log10 delta(epsilon)   (lower is more private)")
    ax.set_title(
        f"Privacy curves of shuffled k-RR: n = {mech.n:,} users, k = {mech.k}, "
        f"eps0 = {mech.eps0:g}, {rounds} round{'s' if rounds > 1 else ''}\n"
        + ("a round is" if rounds == 1 else f"the {rounds} rounds together are")
        + " (epsilon, delta)-DP for every point on or above a sound upper bound",
        fontsize=10,
    )
    ax.grid(True, which="major", alpha=0.3)
    key.axis("off")  # the legend's own panel, under the plot: it never hides a curve
    key.legend(*ax.get_legend_handles_labels(), fontsize=8, loc="upper left", frameon=False)
    fig.tight_layout()
    return fig, drawn
