"""Client side of the shuffle model: k-RR and bit randomization, report encoding, onion
encryption, agents.

The names load on first use (PEP 562 `__getattr__`): `shufflekit simulate`, which needs k-RR
alone (`client.krr`), does not load the agent's MQTT transport and cryptography too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shufflekit.base.lazy import lazy_exports

if TYPE_CHECKING:  # the names and their modules: loaded on first use (`base.lazy`)
    from shufflekit.client.agent import ClientAgent, build_envelope, current_announcement
    from shufflekit.client.bits import BitRR
    from shufflekit.client.krr import KRR
    from shufflekit.client.population import Population

__all__ = ["KRR", "BitRR", "ClientAgent", "Population", "build_envelope", "current_announcement"]

if not TYPE_CHECKING:  # the type checker sees the imports above, and no catch-all
    __getattr__, __dir__ = lazy_exports(__name__)
