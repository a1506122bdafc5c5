"""Client side of the shuffle model: k-RR and bit randomization, report encoding, onion
encryption, agents.

The names load on first use (PEP 562 `__getattr__`): `shufflekit simulate`, which needs k-RR
alone (`client.krr`), does not load the agent's MQTT transport and cryptography too.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what the type checker sees; at run time __getattr__ imports each on first use
    from shufflekit.client.agent import ClientAgent, build_envelope, current_announcement
    from shufflekit.client.bits import BitRR
    from shufflekit.client.krr import KRR
    from shufflekit.client.population import Population

#: Each public name and its module (the `if TYPE_CHECKING` imports above, again); `_module`
#: imports it.
_HOME = {
    **dict.fromkeys(("ClientAgent", "build_envelope", "current_announcement"), "agent"),
    "BitRR": "bits",
    "KRR": "krr",
    "Population": "population",
}

__all__ = ["KRR", "BitRR", "ClientAgent", "Population", "build_envelope", "current_announcement"]


def __getattr__(name: str) -> Any:
    """Import a public name's module on first use and keep the name here (PEP 562)."""
    home = _HOME.get(name)
    if home is None:  # a submodule (`from shufflekit.client import krr`) or a typo
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_module(home), name)
    globals()[name] = value
    return value


def _module(home: str) -> ModuleType:
    """The module `home` names, by a plain import (one the import linter sees)."""
    match home:
        case "agent":
            from shufflekit.client import agent

            return agent
        case "bits":
            from shufflekit.client import bits

            return bits
        case "krr":
            from shufflekit.client import krr

            return krr
        case _:
            from shufflekit.client import population

            return population


def __dir__() -> list[str]:
    """The public names as well as what is loaded, as `dir()` listed them when eager."""
    return sorted(set(globals()) | set(__all__))
