"""Small trio helpers shared by the layers."""

from __future__ import annotations

import collections
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


class Lock:
    """A mutex for trio tasks whose uncontended acquire does not yield.

    `trio.Lock` checkpoints on every acquire (twice: a cancellation check and a reschedule):
    for the per-inode lock every close, release and commit takes, that is a trip through trio's
    run queue per request with nobody else waiting (docs/architecture.md, "The per-file
    budget"). Here an acquire of a free lock returns at once; a contended one waits in FIFO
    order, and a release hands the lock to the first waiter. A waiter cancelled before it got
    the lock leaves the queue; one cancelled just after it was handed the lock passes it on.
    """

    __slots__ = ("_held", "_waiters")

    def __init__(self) -> None:
        self._held = False
        self._waiters: collections.deque[trio.Event] = collections.deque()

    def locked(self) -> bool:
        return self._held

    async def __aenter__(self) -> None:
        if not self._held:
            self._held = True
            return
        ev = trio.Event()
        self._waiters.append(ev)
        try:
            await ev.wait()
        except BaseException:
            if ev.is_set():          # handed over as we were cancelled: give it on
                self._release()
            else:
                self._waiters.remove(ev)
            raise

    async def __aexit__(self, *exc) -> None:
        self._release()

    def _release(self) -> None:
        if self._waiters:
            self._waiters.popleft().set()      # (still held: it passes to that waiter)
        else:
            self._held = False
