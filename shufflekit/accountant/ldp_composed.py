"""Rounds whose shuffle amplifies nothing: answered by the pure-DP pair of the sum of eps0,
with a certificate that this is within a factor e^kappa of the truth at every epsilon.

Upper side. R rounds of k-RR(eps0_r) (each report eps0_r-LDP; the shuffle post-processes it)
are S-DP with S = sum of eps0_r (`core.ldp_epsilon`). Every S-DP pair (P, Q) has
Q >= e^-S P pointwise, so its curve is at most

    H(eps) = sum (P - e^eps Q)^+ <= sum P (1 - e^(eps - S))^+ = (1 - e^(eps - S))^+,

the curve of the PLD with all its mass at loss S. So that one atom is a dominating pair of
the composition, whatever n and k are, and composing it costs nothing.

Lower side (why it is tight). Take the dataset "every other user holds x0" in every round and
the event y* = "all n reports of every round say x0". With p_r = e^eps0_r / (e^eps0_r + k_r - 1)
it has probability prod_r p_r^n_r under the target's x0 and prod_r p_r^(n_r - 1) q_r under x1
(q_r = p_r e^-eps0_r), so the composed mechanism's curve is at least

    P(y*) - e^eps Q(y*) = e^-kappa (1 - e^(eps - S)),   kappa = sum_r n_r log1p((k_r-1) e^-eps0_r).

Hence at every epsilon the one atom's delta is at most e^kappa times the true delta (and so
at most e^kappa times any sound bound's, the tight k = 2 machinery's included), and at every
delta its epsilon, S + log(1 - delta) rounded up, is within -log(1 - delta e^kappa) (about
delta) of the true epsilon, which lies in [S + log(1 - delta e^kappa), S].

Where eps0 is large (n q_r tiny: almost never does another user's report flip), kappa is
tiny and the certified machinery can only reproduce this answer, at great cost: at n = 1e4,
eps0 = 40, 3 rounds it resolves losses spread by 1e-7 over [-40, 40] and takes about a minute
for 120 - 1e-6. `ldp_composed` answers when kappa <= KAPPA_MAX (delta within a factor
1 + 1e-6 of the truth at every epsilon), else returns None and the caller composes the pairs;
`ldp_bounds` adds the lower side, the event's curve e^-kappa (1 - e^(eps - S))^+ itself.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from shufflekit.accountant.composed import ComposedBounds, ComposedPLD
from shufflekit.accountant.core import Mechanism, ldp_epsilon

#: The largest kappa (log of the factor by which the pure-DP answer's delta may exceed the
#: truth, at any epsilon) at which `ldp_composed` answers.
KAPPA_MAX = 1e-6

#: `ComposedPLD.engine` of the answers given here.
ENGINE = "ldp-sum"


def ldp_kappa(rounds: Sequence[Mechanism], counts: Sequence[int]) -> float:
    """kappa = -log P(every report of every round says x0 | all others hold x0): the
    log-factor by which the pure-DP pair of the sum of eps0 may exceed the truth (see the
    module docstring)."""
    return math.fsum(
        c * m.n * math.log1p((m.k - 1) * math.exp(-m.eps0))
        for m, c in zip(rounds, counts, strict=True)
    )


def ldp_composed(
    rounds: Sequence[Mechanism], counts: Sequence[int], kappa_max: float = KAPPA_MAX
) -> ComposedPLD | None:
    """The composition of `rounds` (each `counts` times) as the pure-DP pair of the sum of
    their eps0 (one atom at loss S, exact: no grid, no numerical slack) where their kappa is
    at most `kappa_max`; None where the shuffle may amplify more than that (compose the
    rounds' own pairs)."""
    kappa = ldp_kappa(rounds, counts)
    total = ldp_epsilon(rounds, counts)
    if not (kappa <= kappa_max and total > 0.0 and math.isfinite(total)):
        return None
    return ComposedPLD(
        step=total,
        offset=1,
        probs=np.ones(1, dtype=np.float64),
        inf_mass=0.0,
        log_inf_mass=-math.inf,
        upper=True,
        engine=ENGINE,
        rounds=int(sum(counts)),
        details={"ldp_kappa": kappa, "ldp_kappa_max": kappa_max},
        ldp_cap=total,
    )


def ldp_bounds(
    rounds: Sequence[Mechanism], counts: Sequence[int], with_attack: bool = True
) -> ComposedBounds | None:
    """`ldp_composed` and, `with_attack`, the composed attack "all others at x0, every report
    says x0": one atom of mass e^-kappa at loss S (its curve is the lemma's lower bound, a
    post-processing of that dataset's composed pair: the other outcomes' mass is dropped,
    which only lowers it); None where `ldp_composed` is."""
    upper = ldp_composed(rounds, counts)
    if upper is None:
        return None
    if not with_attack:
        return ComposedBounds(upper=upper, lower=None)
    kappa = float(upper.details["ldp_kappa"])
    lower = ComposedPLD(
        step=upper.step,
        offset=1,
        probs=np.full(1, math.exp(-kappa), dtype=np.float64),
        inf_mass=0.0,
        log_inf_mass=-math.inf,
        upper=False,
        engine=ENGINE,
        rounds=upper.rounds,
        details=dict(upper.details),
    )
    return ComposedBounds(upper=upper, lower=lower)
