"""The stand-in cipher: HPKE's sizes and failure modes, refused outside a simulation."""

from __future__ import annotations

import pytest

from shufflekit.base.errors import ConfigError, InvalidReport
from shufflekit.base.random import SeededRandomness
from shufflekit.core import standin
from shufflekit.core.crypto import KeyPair, onion_size, peel, public_from_b64, seal_onion


def onion(keys: list[KeyPair], rng: SeededRandomness, round_id: str = "r1") -> bytes:
    pubs = [public_from_b64(k.public_b64()) for k in keys]
    return seal_onion(b"report", pubs, "dep", round_id, rng)


def test_same_size_and_layers_peel_in_order() -> None:
    with standin.allowed():
        rng = SeededRandomness(1)
        keys = [KeyPair.standin(rng) for _ in range(3)]
        ct = onion(keys, rng)
        assert len(ct) == onion_size(len(b"report"), 3)
        for hop, key in enumerate(keys):
            ct = peel(ct, key.private, "dep", "r1", hop)
        assert ct == b"report"


@pytest.mark.parametrize("what", ["tampered", "truncated", "foreign", "round", "hop", "deployment"])
def test_it_fails_where_hpke_fails(what: str) -> None:
    with standin.allowed():
        rng = SeededRandomness(2)
        keys = [KeyPair.standin(rng) for _ in range(2)]
        ct = bytearray(onion(keys, rng))
        key, dep, rid, hop = keys[0].private, "dep", "r1", 0
        if what == "tampered":
            ct[-3] ^= 1
        elif what == "truncated":
            del ct[-1]
        elif what == "foreign":
            key = KeyPair.standin(rng).private
        elif what == "round":
            rid = "r2"
        elif what == "hop":
            hop = 1
        else:
            dep = "other"
        with pytest.raises(InvalidReport) as err:
            peel(bytes(ct), key, dep, rid, hop)
        assert err.value.reason == "undecryptable"


def test_seeded_onions_replay() -> None:
    with standin.allowed():
        a = onion([KeyPair.standin(SeededRandomness(3))], SeededRandomness(4))
        b = onion([KeyPair.standin(SeededRandomness(3))], SeededRandomness(4))
    assert a == b


def test_refused_outside_a_simulation() -> None:
    with standin.allowed():
        text = KeyPair.standin(SeededRandomness(5)).private_b64()
        public = KeyPair.from_private_b64(text).public_b64()
    with pytest.raises(ConfigError, match="stand-in"):
        KeyPair.from_private_b64(text)
    with pytest.raises(ConfigError, match="stand-in"):
        public_from_b64(public)
    with pytest.raises(ConfigError, match="stand-in"):
        KeyPair.standin(SeededRandomness(6))
