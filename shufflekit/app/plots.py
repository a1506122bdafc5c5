"""Plots for reports: privacy curves delta(epsilon) of several methods."""

from __future__ import annotations

import math

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
) -> tuple[list[float], list[float]]:
    """log10 delta of method `name` over `eps` (and, for `tight`, of its attack lower bound).

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
    done_up = done_lo = False  # the curve reached the floor (errors do not count)
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
            elif m.pld is not None:
                ld = composition.compose([m.pld(mech)], counts=[rounds]).log_delta(e)
                lo = attack.log_delta(e) if attack is not None else -math.inf
        except AccountantError:  # e.g. a closed form outside its range at this epsilon: a gap
            failed = True
        done_up = done_up or (not failed and not _log10(ld) > FLOOR_LOG10)
        done_lo = done_lo or (not failed and not _log10(lo) > FLOOR_LOG10)
        upper.append(_log10(ld))
        lower.append(_log10(lo))
    return upper, lower


def plot_privacy_curves(path: str, mech: Mechanism, rounds: int, methods: list[str]) -> list[str]:
    """delta(epsilon) of each method on a log-log plot down to 1e-40, written to `path` (PNG).

    `tight` is drawn last (on top), thick and black, with its attack lower bound dashed, so the
    default stays visible when other curves overlap it. Returns the methods drawn, in order.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    top = mech.eps0 * rounds
    eps = np.geomspace(top / 1000, top, POINTS)
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    order = [m for m in methods if m != "tight"] + [m for m in methods if m == "tight"]
    drawn: list[str] = []
    for name in order:
        m = get_method(name)
        upper, lower = _curve(name, mech, rounds, eps)
        label = f"{name} ({m.soundness.name.lower()})"
        if not any(y > FLOOR_LOG10 for y in upper):
            label += f": no delta above 1e{FLOOR_LOG10:.0f}"
        if name == "tight":
            ax.plot(eps, upper, color="black", lw=2.4, zorder=10, label=label)
            ax.plot(
                eps, lower, color="black", lw=1.2, ls="--", zorder=11, label="tight: attack (lower)"
            )
        else:
            ax.plot(eps, upper, lw=1.2, alpha=0.85, zorder=2, label=label)
        drawn.append(name)
    ax.set_xscale("log")
    ax.set_ylim(bottom=FLOOR_LOG10, top=0.5)
    ax.set_xlabel("epsilon")
    ax.set_ylabel("log10 delta")
    ax.set_title(f"n={mech.n}, k={mech.k}, eps0={mech.eps0:g}, rounds={rounds}")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120, format="png")
    plt.close(fig)
    return drawn
