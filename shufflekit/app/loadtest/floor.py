"""The crypto floor: what one report costs in cryptography alone, on this machine, now.

Per report: (L+1) HPKE seals (the client's onion), (L+1) opens (each mix and the analyzer),
the client's proof (one Ed25519 signature by the client, one verification by mix 0, which
checks a client's certificate once and remembers it), and one Ed25519 signature and
verification (the receipt). Measured on every core at once (one process per core, so other
load on the machine counts, as it does for the run it is compared with); the floor in reports
per second is what the cores could do if they did nothing else. `floor_ratio` = achieved / floor.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from shufflekit.core.credentials import EnrollmentKey
from shufflekit.core.crypto import KeyPair, peel, seal_onion
from shufflekit.core.wire import Report


@dataclass(frozen=True)
class Floor:
    """Reports per second the cryptography allows on `cores` cores, and per report cost."""

    reports_per_s: float
    us_per_report: float  # on one core
    cores: int
    mixes: int


def _work(mixes: int, n: int) -> float:
    """Seconds for `n` reports' cryptography in this process."""
    keys = [KeyPair.generate() for _ in range(mixes + 1)]
    pubs = [k.public for k in keys]
    enrol = EnrollmentKey.generate()
    cred = enrol.issue("floor", "client-1")
    from shufflekit.core.credentials import CredentialVerifier

    verifier = CredentialVerifier(enrol.public_b64(), "floor")
    receipt_key = Ed25519PrivateKey.generate()
    receipt_pub = receipt_key.public_key()
    plain = Report(k=4, value=1).encode()
    started = time.perf_counter()
    for _ in range(n):
        ct = seal_onion(plain, pubs, "floor", "r1")
        for hop, k in enumerate(keys):
            ct = peel(ct, k.private, "floor", "r1", hop)
        # mix 0's check: the certificate once per client (remembered), the signature each time
        verifier.verify("client-1", cred.proof("floor", "r1", ct), "r1", ct)
        sig = receipt_key.sign(ct)
        receipt_pub.verify(sig, ct)
    return time.perf_counter() - started


def _ignore_interrupt() -> None:
    """A pool worker leaves Ctrl-C to its parent (which ends the pool): no traceback each."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def measure_floor(mixes: int, *, seconds: float = 2.0, cores: int | None = None) -> Floor:
    """The floor for a cascade of `mixes`, measured for about `seconds` on every core."""
    cores = cores or os.cpu_count() or 1
    probe = max(_work(mixes, 20), 1e-6) / 20
    n = max(50, int(seconds / probe))
    ctx = multiprocessing.get_context("spawn")
    # each process times its own loop: start-up is not counted
    with ctx.Pool(cores, initializer=_ignore_interrupt) as pool:
        times = pool.starmap(_work, [(mixes, n)] * cores)
    rate = sum(n / t for t in times)
    return Floor(rate, cores / rate * 1e6, cores, mixes)
