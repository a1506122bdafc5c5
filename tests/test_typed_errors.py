"""The core and the roles raise the one error tree (shufflekit.base.errors), never a bare
ValueError; the input errors stay ValueErrors, so callers that catch those keep working."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from shufflekit.analyzer.central import CalibrationError as CentralCalibrationError
from shufflekit.analyzer.estimators import EstimatorInputError as EstimatorsInputError
from shufflekit.analyzer.metrics import MetricInputError as MetricsInputError
from shufflekit.analyzer.service import Analyzer
from shufflekit.base import errors
from shufflekit.client.krr import KRR
from shufflekit.core.credentials import CredentialVerifier, EnrollmentKey, certificate_message
from shufflekit.core.crypto import KeyPair, public_from_b64
from shufflekit.core.messages import Announcement, Result
from shufflekit.core.transport import MemoryBroker, mqtt
from shufflekit.core.wire import Chunk, Envelope, Report
from shufflekit.shuffler.mix import MixNode


def test_the_analyzer_errors_are_the_trees_and_keep_their_old_homes() -> None:
    assert EstimatorsInputError is errors.EstimatorInputError
    assert MetricsInputError is errors.MetricInputError
    assert CentralCalibrationError is errors.CalibrationError
    inputs = (EstimatorsInputError, MetricsInputError, CentralCalibrationError, errors.InvalidKey)
    for cls in inputs:
        assert issubclass(cls, errors.InvalidInput) and issubclass(cls, ValueError)
    for cls in (mqtt.BrokerTLSError, mqtt.BrokerAuthError, mqtt.BrokerAccessDenied):
        assert issubclass(cls, errors.TransportError) and getattr(errors, cls.__name__) is cls


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: KRR(1, 1.0), "k must be"),
        (lambda: KRR(3, 0.0), "eps0"),
        (lambda: KRR(3, 1.0).randomize(3), r"in \[0, 2\], got 3"),
        (lambda: Report(10, 10).encode(), "outside"),
        (lambda: Envelope("", b"x").encode(), "client id"),
        (lambda: Envelope("a", b"x", credential=b"c").encode(), "name its round"),
        (lambda: certificate_message("pilot", "x" * 65, b""), "client id"),
    ],
)
def test_bad_input_is_invalid_input(call: Any, match: str) -> None:
    with pytest.raises(errors.InvalidInput, match=match):
        call()


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: public_from_b64("AAAA"), "an X25519 key is 32 bytes, got 3"),
        (lambda: public_from_b64("not base64!"), "an X25519 key is not base64"),
        (lambda: KeyPair.from_private_b64("AAAA"), "an X25519 key is 32 bytes"),
        (lambda: EnrollmentKey.from_private_b64("@@"), "an Ed25519 key is not base64"),
        (lambda: CredentialVerifier("AAAA", "pilot"), "an Ed25519 key is 32 bytes"),
    ],
)
def test_a_malformed_key_is_invalid_key(call: Any, match: str) -> None:
    with pytest.raises(errors.InvalidKey, match=match):
        call()


def test_a_chunk_of_mixed_item_sizes_is_a_bug_of_its_sender() -> None:
    with pytest.raises(errors.InternalError):
        Chunk(hop=1, index=0, items=(b"ab", b"abc")).encode(2)


async def test_a_hop_refuses_an_announcement_naming_another_key() -> None:
    mine, other = KeyPair.generate(), KeyPair.generate()

    async def on_release(result: Result, seal: Callable[[Result], Result]) -> Result:
        return seal(result)

    ann = Announcement(
        deployment="d",
        round_id="r1",
        k=2,
        eps0=1.0,
        n_min=1,
        deadline=0.0,
        mix_keys=[other.public_b64()],
        analyzer_key=other.public_b64(),
    )
    async with MemoryBroker().connect() as t:
        with pytest.raises(errors.ConfigError, match="mix 0: the announcement names another"):
            await MixNode(t, "d", 0, mine).run_round(ann)
        with pytest.raises(errors.ConfigError, match="mix 1: the round has 1 mixes"):
            await MixNode(t, "d", 1, mine).run_round(ann)
        analyzer = Analyzer(t, "d", mine, on_release=on_release)
        with pytest.raises(errors.ConfigError, match="the analyzer: the announcement names"):
            await analyzer.run_round(ann)
        with pytest.raises(errors.ConfigError, match="hop"):
            analyzer.inbox()
