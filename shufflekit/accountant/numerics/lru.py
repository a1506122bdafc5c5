"""The accountant's memo: a thread-safe least-recently-used cache bounded in entries and bytes.

Per-round PLDs, gridded PLDs and the refined k = 2 leaves are costly to build and asked for
again and again (calibration, the ledger's every charge); each is kept in one of these.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class BoundedLRU(Generic[K, V]):
    """At most `max_items` values and `max_bytes` (as `nbytes` measures each value); the least
    recently used go first. Safe to share between threads."""

    def __init__(
        self, max_items: int, max_bytes: int | None = None, nbytes: Callable[[V], int] | None = None
    ) -> None:
        self.max_items = max_items
        self.max_bytes = max_bytes
        self._nbytes = nbytes
        self._items: OrderedDict[K, V] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        """The cached value of `key` (now the most recently used), or None."""
        with self._lock:
            hit = self._items.get(key)
            if hit is not None:
                self._items.move_to_end(key)
            return hit

    def put(self, key: K, value: V) -> V:
        """Keep `value` for `key` and return what the cache holds for it: an equal value another
        thread computed and stored meanwhile wins, so every caller shares one object."""
        with self._lock:
            held = self._items.get(key)
            if held is not None:
                return held
            self._items[key] = value
            self._bytes += self._size(value)
            while self._items and (
                len(self._items) > self.max_items
                or (self.max_bytes is not None and self._bytes > self.max_bytes)
            ):
                _, old = self._items.popitem(last=False)
                self._bytes -= self._size(old)
            return value

    def replace(self, key: K, value: V) -> None:
        """Keep `value` for `key`, in place of what was held for it."""
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= self._size(old)
        self.put(key, value)

    def clear(self) -> None:
        """Forget every value."""
        with self._lock:
            self._items.clear()
            self._bytes = 0

    def __len__(self) -> int:
        return len(self._items)

    def _size(self, value: V) -> int:
        return self._nbytes(value) if self._nbytes is not None else 0
