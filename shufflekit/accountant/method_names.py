"""The registry's method names, in its order, apart from the methods (and their numerics).

`shufflekit privacy epsilon --help` lists them; importing this costs nothing, where
`accountant.registry` loads every bound (numpy, scipy). The registry refuses to load if its
table and these names disagree, so the list cannot drift.
"""

PRIMARY_NAMES: tuple[str, ...] = (
    "tight",
    "blanket-strong",
    "blanket-weak",
    "clones",
    "erlingsson",
    "balle-closed",
    "biswas",
    "biswas-corrected",
    "ldp",
)
VARIANT_NAMES: tuple[str, ...] = (
    "blanket-strong-tail",
    "blanket-strong-exact",
    "blanket-weak-tail",
    "clones-closed",
)


def method_names(include_variants: bool = False) -> list[str]:
    """Names of `registry.all_methods(include_variants)`."""
    return list(PRIMARY_NAMES + (VARIANT_NAMES if include_variants else ()))
