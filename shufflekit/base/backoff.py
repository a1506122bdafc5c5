"""Retrying a call that fails transiently, with exponential backoff on an injected clock."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from shufflekit.base.clock import Clock

T = TypeVar("T")


async def with_backoff(
    call: Callable[[], Awaitable[T]],
    retry_on: type[BaseException] | tuple[type[BaseException], ...],
    *,
    clock: Clock,
    patience: float,
    first: float,
    cap: float,
    on_retry: Callable[[BaseException, float], None] | None = None,
) -> T:
    """`await call()`, again after `first` seconds (doubling up to `cap`) while it raises
    `retry_on`; once `patience` seconds of `clock` have passed since the first failure, the
    error stands. The time a try blocks counts (a SQLite write waits out another's lock before
    it fails), so a try starts at most `patience` after the first failure, not after `patience`
    seconds of sleeps alone. `on_retry(error, delay)` is told of each wait before it starts."""
    since: float | None = None
    delay = first
    while True:
        try:
            return await call()
        except retry_on as exc:
            now = clock.monotonic()
            since = now if since is None else since
            if now - since >= patience:
                raise
            if on_retry is not None:
                on_retry(exc, delay)
            await clock.sleep(delay)
            delay = min(2 * delay, cap)
