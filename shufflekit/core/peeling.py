"""Checking and peeling many onions at once, inline or in a pool of worker processes.

A mix peels its layer as reports arrive (not all at the round's close), so its crypto overlaps
with ingest. The pool is injected: services peel in worker processes (`ProcessPeeler`), the
deterministic simulation and in-process deployments peel here and now (`InlinePeeler`, which
adds no scheduling point, so the simulation's order of events does not change). Both run the
same two functions, `check_envelopes` (mix 0) and `peel_layers` (mixes 1..L-1); which report is
kept (de-duplication) is decided by the mix, in arrival order, after the pool returns.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import multiprocessing
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Protocol

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from shufflekit.base.errors import InvalidReport
from shufflekit.core import standin
from shufflekit.core.credentials import CredentialVerifier, admit
from shufflekit.core.crypto import PrivateKey, peel
from shufflekit.core.wire import Envelope

MIN_PER_TASK = 64  # the smallest slice handed to one worker process
PARENT_CHECK = 1.0  # seconds between a worker's checks that its service still runs


@dataclass(frozen=True)
class PeelJob:
    """What a worker needs to peel one hop's layer of one round (picklable: raw key bytes).

    `enrollment` is (public key base64, deployment) of the credential verifier, mix 0 only.
    """

    key: bytes | standin.StandInPrivate
    deployment: str
    round_id: str
    hop: int
    onion_size: int = 0
    enrollment: tuple[str, str] | None = None

    @classmethod
    def of(
        cls,
        key: PrivateKey,
        deployment: str,
        round_id: str,
        hop: int,
        *,
        onion_size: int = 0,
        verifier: CredentialVerifier | None = None,
    ) -> PeelJob:
        """The job for `key` (an X25519 key travels as its raw bytes)."""
        raw: bytes | standin.StandInPrivate
        if isinstance(key, X25519PrivateKey):
            from cryptography.hazmat.primitives import serialization as s

            raw = key.private_bytes(s.Encoding.Raw, s.PrivateFormat.Raw, s.NoEncryption())
        else:
            raw = key
        enrollment = (verifier.public_b64, verifier.deployment) if verifier is not None else None
        return cls(raw, deployment, round_id, hop, onion_size, enrollment)


@dataclass(frozen=True)
class Checked:
    """Mix 0's view of one envelope: why it was refused before its onion was opened
    (`refused`), else its client, the onion's digest and the peeled layer or why it failed."""

    refused: str | None
    client_id: str = ""
    digest: bytes = b""
    inner: bytes | None = None
    failed: str | None = None


@functools.lru_cache(maxsize=16)
def _x25519(raw: bytes) -> X25519PrivateKey:
    return X25519PrivateKey.from_private_bytes(raw)


@functools.lru_cache(maxsize=16)
def _verifier(public_b64: str, deployment: str) -> CredentialVerifier:
    return CredentialVerifier(public_b64, deployment)


def _key(job: PeelJob) -> PrivateKey:
    return _x25519(job.key) if isinstance(job.key, bytes) else job.key


def check_envelopes(job: PeelJob, payloads: Sequence[bytes]) -> list[Checked]:
    """Mix 0: decode each envelope, check its round and credential, peel its outer layer."""
    key = _key(job)
    verifier = _verifier(*job.enrollment) if job.enrollment is not None else None
    out: list[Checked] = []
    for payload in payloads:
        try:
            env = Envelope.decode(payload, job.onion_size)
            admit(env, job.round_id, verifier)
        except InvalidReport as exc:
            out.append(Checked(exc.reason))
            continue
        digest = hashlib.sha256(env.onion).digest()
        try:
            inner = peel(env.onion, key, job.deployment, job.round_id, job.hop)
        except InvalidReport as exc:
            out.append(Checked(None, env.client_id, digest, None, exc.reason))
            continue
        out.append(Checked(None, env.client_id, digest, inner))
    return out


def peel_layers(job: PeelJob, items: Sequence[bytes]) -> list[bytes | str]:
    """Mix i > 0: each item peeled, or the reason it could not be (a str)."""
    key = _key(job)
    out: list[bytes | str] = []
    for ct in items:
        try:
            out.append(peel(ct, key, job.deployment, job.round_id, job.hop))
        except InvalidReport as exc:
            out.append(exc.reason)
    return out


def _exit_with_parent(parent: int) -> None:
    """In a worker: exit once the service that started it is gone. A service killed with -9
    cannot stop its workers, which would otherwise idle on forever (one pool per restart)."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK)
        os._exit(0)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def _started() -> bool:
    """A worker's first task: it is up, with this module (and the crypto) imported."""
    return True


class Peeler(Protocol):
    """Where a mix's crypto runs: `envelopes` (mix 0) and `layers` (later mixes), in order."""

    async def envelopes(self, job: PeelJob, payloads: Sequence[bytes]) -> list[Checked]: ...

    async def layers(self, job: PeelJob, items: Sequence[bytes]) -> list[bytes | str]: ...

    def close(self) -> None: ...


class InlinePeeler:
    """Peel here and now, without a scheduling point (simulation, in-process deployments)."""

    async def envelopes(self, job: PeelJob, payloads: Sequence[bytes]) -> list[Checked]:
        """`check_envelopes` in this thread."""
        return check_envelopes(job, payloads)

    async def layers(self, job: PeelJob, items: Sequence[bytes]) -> list[bytes | str]:
        """`peel_layers` in this thread."""
        return peel_layers(job, items)

    def close(self) -> None:
        """Nothing to release."""


class ProcessPeeler:
    """Peel in `workers` worker processes (spawned on first use): the services' pool."""

    def __init__(self, workers: int) -> None:
        self.workers = max(1, workers)
        self._pool: ProcessPoolExecutor | None = None

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            ctx = multiprocessing.get_context("spawn")  # no fork of a process with threads
            self._pool = ProcessPoolExecutor(
                self.workers,
                mp_context=ctx,
                initializer=_exit_with_parent,
                initargs=(os.getpid(),),
            )
        return self._pool

    def start(self) -> None:
        """Start every worker process now (once) and wait until each has imported the peeling
        code, so a round does not pay for that (a second per worker) while its reports arrive."""
        if self._pool is not None:
            return
        pool = self._executor()
        for f in [pool.submit(_started) for _ in range(self.workers)]:
            f.result()

    def _slices(self, n: int) -> list[slice]:
        per = max(MIN_PER_TASK, -(-n // (2 * self.workers)))
        return [slice(i, i + per) for i in range(0, n, per)]

    async def envelopes(self, job: PeelJob, payloads: Sequence[bytes]) -> list[Checked]:
        """`check_envelopes` over slices of `payloads` in the pool, results in order (never in
        the service's event loop, which keeps receiving meanwhile)."""
        loop, pool = asyncio.get_running_loop(), self._executor()
        parts = await asyncio.gather(
            *(
                loop.run_in_executor(pool, check_envelopes, job, list(payloads[s]))
                for s in self._slices(len(payloads))
            )
        )
        return [c for part in parts for c in part]

    async def layers(self, job: PeelJob, items: Sequence[bytes]) -> list[bytes | str]:
        """`peel_layers` over slices of `items` in the pool, results in order."""
        loop, pool = asyncio.get_running_loop(), self._executor()
        parts = await asyncio.gather(
            *(
                loop.run_in_executor(pool, peel_layers, job, list(items[s]))
                for s in self._slices(len(items))
            )
        )
        return [c for part in parts for c in part]

    def close(self) -> None:
        """Stop the worker processes."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
