"""Wire formats: fixed sizes, versioning, and typed rejection of malformed input."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shufflekit.base.errors import InvalidReport
from shufflekit.core.wire import (
    REPORT_SIZE,
    Chunk,
    Envelope,
    Report,
    batch_digest,
    split_chunks,
)


def test_report_roundtrip_and_fixed_size() -> None:
    for v in (0, 5, 9):
        data = Report(10, v).encode()
        assert len(data) == REPORT_SIZE
        assert Report.decode(data, 10) == Report(10, v)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\x01\x01\x00\x0a\x00", "bad_length"),
        (b"\x02\x01\x00\x0a\x00\x01", "bad_version"),
        (b"\x01\x07\x00\x0a\x00\x01", "bad_randomizer"),
        (b"\x01\x01\x00\x0b\x00\x01", "bad_k"),
        (b"\x01\x01\x00\x0a\x00\x0a", "bad_value"),
    ],
)
def test_report_rejections(data: bytes, reason: str) -> None:
    with pytest.raises(InvalidReport) as e:
        Report.decode(data, 10)
    assert e.value.reason == reason


def test_report_refuses_out_of_range_value() -> None:
    with pytest.raises(ValueError):
        Report(10, 10).encode()


def test_envelope_roundtrip_and_rejections() -> None:
    env = Envelope("client-1", b"x" * 40)
    assert Envelope.decode(env.encode(), 40) == env
    with pytest.raises(InvalidReport) as e:
        Envelope.decode(env.encode(), 41)
    assert e.value.reason == "bad_length"
    for junk in (b"", b"\x01", b"\x09\x01a", b"\x01\x00", b"\x01\x05ab"):
        with pytest.raises(InvalidReport):
            Envelope.decode(junk, 40)


@given(st.binary(max_size=200))
def test_envelope_never_crashes_on_random_bytes(data: bytes) -> None:
    with contextlib.suppress(InvalidReport):
        Envelope.decode(data, 54)


def test_chunks_roundtrip_and_digest() -> None:
    items = [bytes([i]) * 8 for i in range(23)]
    chunks = split_chunks(items, hop=1, per_chunk=10)
    assert [len(c.items) for c in chunks] == [10, 10, 3]
    back = [Chunk.decode(c.encode(8), 1, 8) for c in chunks]
    assert [it for c in back for it in c.items] == items
    assert batch_digest(items) != batch_digest(list(reversed(items)))
    with pytest.raises(InvalidReport) as e:
        Chunk.decode(chunks[0].encode(8), 2, 8)
    assert e.value.reason == "wrong_hop"
    with pytest.raises(InvalidReport):
        Chunk.decode(chunks[0].encode(8)[:-1], 1, 8)


@given(st.binary(max_size=300))
def test_chunk_never_crashes_on_random_bytes(data: bytes) -> None:
    with contextlib.suppress(InvalidReport):
        Chunk.decode(data, 1, 8)


def test_a_longer_report_envelope_or_chunk_is_refused_not_trimmed() -> None:
    """Every parser takes its exact length: bytes past a report, an envelope's onion or a
    chunk's items are refused (`bad_length`), never cut off and the rest accepted."""
    report = Report(10, 3).encode()
    env = Envelope("client-1", b"x" * 40).encode()
    chunk = Chunk(hop=1, index=0, items=(b"a" * 8, b"b" * 8)).encode(8)
    assert Report.decode(report, 10) == Report(10, 3)
    assert Envelope.decode(env, 40).onion == b"x" * 40
    assert len(Chunk.decode(chunk, 1, 8).items) == 2
    for decode in (
        lambda: Report.decode(report + b"\x00", 10),
        lambda: Envelope.decode(env + b"x", 40),
        lambda: Chunk.decode(chunk + b"\x00", 1, 8),
    ):
        with pytest.raises(InvalidReport) as e:
            decode()
        assert e.value.reason == "bad_length"
