"""One hop to a worker thread and back, cheaper than `trio.to_thread.run_sync`, for the jobs
on a file's path (a namespace's reads and writes, the catalog's WAL flush).

`trio.to_thread.run_sync` wraps each job in a capacity limiter, a cancel scope, a copy of the
context and the machinery that lets the thread call back into trio; on the daemon's one trio
thread that was the largest single item of a stored file's cost in the profiles (the per-file
budget in docs/architecture.md). These jobs need none of it: their callers already bound how
many run at once (a namespace's I/O slots, one catalog round at a time), the functions never
call back into trio, and a job, once started, is waited for (as to_thread's default: a
cancelled caller waits until the thread is done, then sees the cancellation). What is left is
trio's thread cache and one `run_sync_soon` to wake the waiting task.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import trio

T = TypeVar("T")


async def run_sync(fn: Callable[..., T], *args) -> T:
    """fn(*args) in a worker thread; its result, or its exception raised here."""
    task = trio.lowlevel.current_task()
    token = trio.lowlevel.current_trio_token()

    def deliver(result) -> None:              # in the worker thread
        try:
            token.run_sync_soon(trio.lowlevel.reschedule, task, result)
        except trio.RunFinishedError:         # trio has exited: nobody waits for it
            pass

    trio.lowlevel.start_thread_soon(lambda: fn(*args), deliver)
    # (the outcome that wakes the task is unwrapped there: fn's value, or its exception raised)
    return await trio.lowlevel.wait_task_rescheduled(lambda _: trio.lowlevel.Abort.FAILED)
