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
    `retry_on`; once `patience` seconds of `clock` were spent waiting, the error stands.
    `on_retry(error, delay)` is told of each wait before it starts (a service logs it)."""
    waited, delay = 0.0, first
    while True:
        try:
            return await call()
        except retry_on as exc:
            if waited >= patience:
                raise
            if on_retry is not None:
                on_retry(exc, delay)
            await clock.sleep(delay)
            waited += delay
            delay = min(2 * delay, cap)
