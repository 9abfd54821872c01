"""``async with`` for the objects that own connections::

    class Pool(AsyncClosing):
        async def aclose(self) -> None:
            await self.client.aclose()

    async with Pool() as pool:   # leaving the block awaits pool.aclose()
        ...

The relay switcher and the calibrator are such objects.
"""

from __future__ import annotations

from typing import Self


class AsyncClosing:
    """An async context manager whose exit awaits :meth:`aclose`."""

    async def aclose(self) -> None:
        """Close what the object holds open (subclasses do)."""
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
