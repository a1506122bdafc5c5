"""Onion encryption: layers peel in order, and `info` binds deployment, round and hop."""

from __future__ import annotations

import pytest

from shufflekit.base.errors import InvalidReport
from shufflekit.core.crypto import KeyPair, onion_size, peel, public_from_b64, seal_onion


def _onion(keys: list[KeyPair], plaintext: bytes = b"report") -> bytes:
    return seal_onion(plaintext, [k.public for k in keys], "dep", "r1")


def test_layers_peel_in_order() -> None:
    keys = [KeyPair.generate() for _ in range(4)]
    ct = _onion(keys)
    assert len(ct) == onion_size(6, 4)
    for hop, k in enumerate(keys):
        ct = peel(ct, k.private, "dep", "r1", hop)
    assert ct == b"report"


@pytest.mark.parametrize(
    ("dep", "rnd", "hop"), [("other", "r1", 0), ("dep", "r2", 0), ("dep", "r1", 1)]
)
def test_info_binds_deployment_round_and_hop(dep: str, rnd: str, hop: int) -> None:
    keys = [KeyPair.generate() for _ in range(2)]
    with pytest.raises(InvalidReport) as e:
        peel(_onion(keys), keys[0].private, dep, rnd, hop)
    assert e.value.reason == "undecryptable"


def test_wrong_key_tampered_and_truncated_fail() -> None:
    keys = [KeyPair.generate() for _ in range(2)]
    ct = _onion(keys)
    tampered = ct[:-1] + bytes([ct[-1] ^ 1])
    for bad, key in ((ct, keys[1]), (tampered, keys[0]), (ct[:-3], keys[0]), (b"", keys[0])):
        with pytest.raises(InvalidReport):
            peel(bad, key.private, "dep", "r1", 0)


def test_key_serialisation_roundtrip() -> None:
    k = KeyPair.generate()
    assert KeyPair.from_private_b64(k.private_b64()).public_b64() == k.public_b64()
    assert public_from_b64(k.public_b64()) is not None
    with pytest.raises(ValueError):
        public_from_b64("AAAA")
