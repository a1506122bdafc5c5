"""Plots for reports: privacy curves delta(epsilon) of several methods."""

from __future__ import annotations

import math

import numpy as np

from accountant import composition
from accountant.core import Mechanism
from accountant.errors import AccountantError
from accountant.registry import get_method

FLOOR_LOG10 = -40.0
"""Curves stop below this log10 delta: nobody reads them there, and evaluating them is slow."""


def plot_privacy_curves(path: str, mech: Mechanism, rounds: int, methods: list[str]) -> None:
    """delta(epsilon) of each method on a log scale down to 1e-40, written to `path` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    top = mech.eps0 * rounds
    eps = np.linspace(top / 200, top, 60)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name in methods:
        m = get_method(name)
        ys: list[float] = []
        for e in eps:
            if ys and not ys[-1] > FLOOR_LOG10:  # delta(eps) is non-increasing: done
                ys.append(np.nan)
                continue
            try:
                if rounds == 1:
                    ld = m.delta(mech, float(e)).log_delta
                elif m.pld is not None:
                    ld = composition.compose([m.pld(mech)], counts=[rounds]).log_delta(float(e))
                else:
                    ld = -math.inf
            except AccountantError:
                ld = -math.inf
            ys.append(ld / math.log(10) if ld > -math.inf else np.nan)
        ax.plot(eps, ys, label=f"{name} ({m.soundness.name.lower()})")
    ax.set_ylim(bottom=FLOOR_LOG10)
    ax.set_xlabel("epsilon")
    ax.set_ylabel("log10 delta")
    ax.set_title(f"n={mech.n}, k={mech.k}, eps0={mech.eps0:g}, rounds={rounds}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
