"""Client side of the shuffle model: k-RR and bit randomization, report encoding, onion
encryption, agents."""

from shufflekit.client.agent import ClientAgent, build_envelope, current_announcement
from shufflekit.client.bits import BitRR
from shufflekit.client.krr import KRR
from shufflekit.client.population import Population

__all__ = ["KRR", "BitRR", "ClientAgent", "Population", "build_envelope", "current_announcement"]
