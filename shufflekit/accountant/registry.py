"""Registry of every per-round bound for shuffled k-RR, each with its soundness label, so the CLI
and reports can list, compare and look them up by name.

    from shufflekit.accountant.registry import get_method, all_methods
    m = get_method("blanket-weak")
    m.epsilon(Mechanism(n=100_000, k=10, eps0=4.0), 1e-6)   # -> PrivacyResult
    m.delta(mech, 0.5)                                     # -> PrivacyResult (log_delta set)
    m.pld(mech) if m.pld else None                         # dominating pair for composition

Primary methods (`all_methods()`, in this order):

| name             | soundness       | what                                                        |
|------------------|-----------------|-------------------------------------------------------------|
| tight            | SOUND_UPPER     | exact worst case and its attack (accountant.tight)          |
| blanket-strong   | SOUND_UPPER     | Koskela et al. Thm 8 pair, hockey-stick                     |
| blanket-weak     | SOUND_UPPER     | Koskela et al. Thm 10 pair (others' blanket bits known)     |
| clones           | SOUND_UPPER     | Feldman-McMillan-Talwar pair, exact hockey-stick            |
| erlingsson       | SOUND_UPPER     | Erlingsson et al. 2019 closed form, NotApplicable outside   |
| balle-closed     | SOUND_UPPER     | Balle et al. 2019 Thm 3.1 closed form (eps <= 1 only)       |
| biswas           | NOT_A_GUARANTEE | Biswas et al. Thm 4.1 as printed, n_x0 = 0.8 n              |
| biswas-corrected | LOWER_BOUND     | x0-count marginal, corrected, max over n_x0 in {0, n-1}     |
| ldp              | SOUND_UPPER     | one k-RR report: (eps0, 0) and its profile (the cap)        |

Variants (choice documented here): the registry's callables take no options, so each variant of
a published bound is a SEPARATE NAME, reachable with `get_method` and listed by
`all_methods(include_variants=True)`; the module functions take the same choices as keyword
arguments (`form=`, `beta_mixture=`, `closed_form=`, `n_x0=`, `histogram=`):

| name                 | soundness   | module call                                           |
|----------------------|-------------|-------------------------------------------------------|
| blanket-strong-tail  | SOUND_UPPER | blanket.strong_*(form="tail"): Thm 8 as printed, eq. 2.4 |
| blanket-strong-exact | SOUND_UPPER | blanket.strong_*(beta_mixture=True): exact A_s view     |
| blanket-weak-tail    | SOUND_UPPER | blanket.weak_*(form="tail"): Thm 10/11 as printed       |
| clones-closed        | SOUND_UPPER | clones.clones_*(closed_form=True): official closed form |

Every result is capped by the LDP bound (`ldp`): the cap is stated in `note` and in
`details["ldp_cap_applied"]`. PLDs are the methods' own pairs, NOT capped (a pointwise minimum
of two privacy curves is not a pair); `pld` is None for closed forms, lower bounds and
non-guarantees. Methods that are not defined for the parameters raise `NotApplicable`.
Only SOUND_UPPER results may enforce a budget.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from shufflekit.accountant import biswas, blanket, clones, closed_forms, ldp, tight
from shufflekit.accountant.core import (
    Mechanism,
    PrivacyLossDistribution,
    PrivacyResult,
    Soundness,
    lookup,
)
from shufflekit.accountant.curve_pld import composition_pld
from shufflekit.accountant.method_names import PRIMARY_NAMES as LISTED_PRIMARY
from shufflekit.accountant.method_names import VARIANT_NAMES as LISTED_VARIANTS
from shufflekit.base.errors import InternalError


@dataclass(frozen=True)
class Method:
    """One bound: its name, what it may be used for, and how to evaluate it."""

    name: str
    soundness: Soundness
    summary: str  # one line, shown in CLI output
    delta: Callable[[Mechanism, float], PrivacyResult]  # epsilon -> result (log_delta set)
    epsilon: Callable[[Mechanism, float], PrivacyResult]  # target delta -> result (epsilon set)
    pld: Callable[[Mechanism], PrivacyLossDistribution] | None  # dominating pair, if any


# ----------------------------------------------------------------------------- tight


def _tight_delta(mech: Mechanism, epsilon: float) -> PrivacyResult:
    return ldp.cap_delta(tight.tight_delta(mech, epsilon), mech)


def _tight_epsilon(mech: Mechanism, delta: float) -> PrivacyResult:
    return ldp.cap_epsilon(tight.tight_epsilon(mech, delta), mech, delta)


# ----------------------------------------------------------------------------- table


def _variant(
    base: Method,
    suffix: str,
    summary: str,
    pld: Callable[[Mechanism], PrivacyLossDistribution] | None,
    **options: Any,
) -> Method:
    """Method `{base.name}-{suffix}`: `base`'s delta and epsilon given `options`, pair `pld`."""
    return Method(
        f"{base.name}-{suffix}",
        base.soundness,
        summary,
        partial(base.delta, **options),
        partial(base.epsilon, **options),
        pld,
    )


def _build() -> tuple[dict[str, Method], tuple[str, ...], tuple[str, ...]]:
    up = Soundness.SOUND_UPPER
    primary = [
        Method(
            "tight",
            up,
            "exact worst-case delta of shuffled k-RR (upper bound, with the matching attack)",
            _tight_delta,
            _tight_epsilon,
            composition_pld,  # the pair `privacy epsilon --rounds` composes
        ),
        Method(
            blanket.STRONG,
            up,
            blanket.SUMMARY_STRONG,
            blanket.strong_delta,
            blanket.strong_epsilon,
            blanket.strong_pld,
        ),
        Method(
            blanket.WEAK,
            up,
            blanket.SUMMARY_WEAK,
            blanket.weak_delta,
            blanket.weak_epsilon,
            blanket.weak_pld,
        ),
        Method(
            clones.METHOD,
            up,
            clones.SUMMARY,
            clones.clones_delta,
            clones.clones_epsilon,
            clones.clones_pld,
        ),
        Method(
            closed_forms.ERLINGSSON,
            up,
            closed_forms.SUMMARY_ERLINGSSON,
            closed_forms.erlingsson_delta,
            closed_forms.erlingsson_epsilon,
            None,
        ),
        Method(
            closed_forms.BALLE,
            up,
            closed_forms.SUMMARY_BALLE,
            closed_forms.balle_delta,
            closed_forms.balle_epsilon,
            None,
        ),
        Method(
            biswas.PRINTED,
            Soundness.NOT_A_GUARANTEE,
            biswas.SUMMARY_PRINTED,
            biswas.biswas_delta,
            biswas.biswas_epsilon,
            None,
        ),
        Method(
            biswas.CORRECTED,
            Soundness.LOWER_BOUND,
            biswas.SUMMARY_CORRECTED,
            biswas.corrected_delta,
            biswas.corrected_epsilon,
            None,
        ),
        Method(ldp.METHOD, up, ldp.SUMMARY, ldp.ldp_delta, ldp.ldp_epsilon, ldp.ldp_pld),
    ]
    named = {m.name: m for m in primary}
    strong, weak, fmt = named[blanket.STRONG], named[blanket.WEAK], named[clones.METHOD]
    exact_pld = partial(blanket.strong_pld, beta_mixture=True)
    variants = [
        _variant(strong, "tail", blanket.SUMMARY_STRONG_TAIL, strong.pld, form="tail"),
        _variant(strong, "exact", blanket.SUMMARY_STRONG_EXACT, exact_pld, beta_mixture=True),
        _variant(weak, "tail", blanket.SUMMARY_WEAK_TAIL, weak.pld, form="tail"),
        _variant(fmt, "closed", clones.SUMMARY_CLOSED, None, closed_form=True),
    ]
    return (
        named | {m.name: m for m in variants},
        tuple(m.name for m in primary),
        tuple(m.name for m in variants),
    )


_TABLE, PRIMARY_NAMES, VARIANT_NAMES = _build()
if (PRIMARY_NAMES, VARIANT_NAMES) != (LISTED_PRIMARY, LISTED_VARIANTS):
    # the command line's --help lists accountant.method_names without loading this module
    raise InternalError(
        f"accountant.method_names lists {LISTED_PRIMARY} and {LISTED_VARIANTS}; "
        f"the registry has {PRIMARY_NAMES} and {VARIANT_NAMES}"
    )


def get_method(name: str) -> Method:
    """The method called `name`; InvalidParameters (listing the valid names) otherwise."""
    return lookup(_TABLE, name, f"unknown method {name!r}", PRIMARY_NAMES + VARIANT_NAMES)


def all_methods(include_variants: bool = False) -> list[Method]:
    """The primary methods in display order (plus the variants when asked)."""
    names = PRIMARY_NAMES + (VARIANT_NAMES if include_variants else ())
    return [_TABLE[n] for n in names]


def method_names(include_variants: bool = False) -> list[str]:
    """Names of `all_methods(include_variants)`."""
    return list(PRIMARY_NAMES + (VARIANT_NAMES if include_variants else ()))
