"""Small trio helpers shared by the layers: running thunks side by side (`run_all`), a lock
whose free acquire does not yield (`Lock`), and one hop to a worker thread and back
(`run_sync`).

`run_sync`: one hop to a worker thread and back, cheaper than `trio.to_thread.run_sync`, for the
jobs on a file's path (a namespace's reads and writes, the catalog's WAL flush).

`trio.to_thread.run_sync` wraps each job in a capacity limiter, a cancel scope, a copy of the
context and the machinery that lets the thread call back into trio; on the daemon's one trio
thread that was the largest single item of a stored file's cost in the profiles (the per-file
budget in docs/performance.md). These jobs need none of it: their callers already bound how
many run at once (a namespace's I/O slots, one catalog round at a time), the functions never
call back into trio, and a job, once started, is waited for (as to_thread's default: a
cancelled caller waits until the thread is done, then sees the cancellation). What is left is
trio's thread cache and one `run_sync_soon` to wake the waiting task.
"""

from __future__ import annotations

import collections
from typing import Awaitable, Callable, Iterable, TypeVar

import trio

T = TypeVar("T")


async def run_all(thunks: Iterable[Callable[[], Awaitable[object]]]) -> None:
    """Run the thunks concurrently and wait for all of them, even when some fail.

    Siblings are not cancelled on a failure: each of them owns I/O into a shared buffer that must
    finish before the buffer can be reused. Raises the first exception, unwrapped from trio's
    exception groups (so callers can catch KvfsError).
    """
    thunks = list(thunks)
    if len(thunks) == 1:  # nothing to run alongside: no nursery
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
            if ev.is_set():  # handed over as we were cancelled: give it on
                self._release()
            else:
                self._waiters.remove(ev)
            raise

    async def __aexit__(self, *exc) -> None:
        self._release()

    def _release(self) -> None:
        if self._waiters:
            self._waiters.popleft().set()  # (still held: it passes to that waiter)
        else:
            self._held = False


async def run_sync(fn: Callable[..., T], *args) -> T:
    """fn(*args) in a worker thread; its result, or its exception raised here."""
    task = trio.lowlevel.current_task()
    token = trio.lowlevel.current_trio_token()

    def deliver(result) -> None:  # in the worker thread
        try:
            token.run_sync_soon(trio.lowlevel.reschedule, task, result)
        except trio.RunFinishedError:  # trio has exited: nobody waits for it
            pass

    trio.lowlevel.start_thread_soon(lambda: fn(*args), deliver)
    # (the outcome that wakes the task is unwrapped there: fn's value, or its exception raised)
    return await trio.lowlevel.wait_task_rescheduled(lambda _: trio.lowlevel.Abort.FAILED)
