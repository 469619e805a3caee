"""Small trio helpers shared by the layers."""

from __future__ import annotations

from typing import Awaitable, Callable, Iterable

import trio


async def run_all(thunks: Iterable[Callable[[], Awaitable[object]]]) -> None:
    """Run the thunks concurrently and wait for all of them, even when some fail.

    Siblings are not cancelled on a failure: each of them owns I/O into a shared buffer that must
    finish before the buffer can be reused. Raises the first exception, unwrapped from trio's
    exception groups (so callers can catch KvfsError).
    """
    thunks = list(thunks)
    if len(thunks) == 1:                 # nothing to run alongside: no nursery
        await thunks[0]()
        return
    errors: list[BaseException] = []

    async def guarded(fn: Callable[[], Awaitable[object]]) -> None:
        try:
            await fn()
        except Exception as e:  # noqa: BLE001 - collected and re-raised below
            errors.append(e)

    async with trio.open_nursery() as nursery:
        for fn in thunks:
            nursery.start_soon(guarded, fn)
    if errors:
        raise errors[0]
