"""`async with obj:` for objects that must be closed however the block ends.

One `__aexit__` for every such object (a transport, a receipt box): it awaits `obj.close()`.
"""

from __future__ import annotations

from types import TracebackType


class AsyncClosing:
    """Mixin: leaving `async with self` (normally or by an exception) awaits `self.close()`."""

    async def close(self) -> None:
        """Release what the object holds; called once when its `async with` block ends."""
        raise NotImplementedError

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
