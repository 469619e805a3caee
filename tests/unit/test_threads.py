"""kvfs.tasks.run_sync: a worker-thread hop with to_thread's semantics on the I/O paths."""

import threading
import time

import pytest
import trio

from kvfs import tasks


def test_runs_in_another_thread_and_returns_its_value():
    async def main():
        return await tasks.run_sync(lambda a, b: (threading.get_ident(), a + b), 2, 3)

    ident, value = trio.run(main)
    assert value == 5 and ident != threading.get_ident()


def test_an_exception_in_the_thread_is_raised_in_the_caller():
    def fails():
        raise OSError(5, "device gone")

    async def main():
        with pytest.raises(OSError, match="device gone"):
            await tasks.run_sync(fails)

    trio.run(main)


def test_a_cancelled_caller_waits_for_its_job_then_sees_the_cancellation():
    """The job's buffers stay in use while the thread runs: a cancel never abandons it."""
    finished = []

    def slow():
        time.sleep(0.2)
        finished.append(True)
        return "done"

    async def main():
        with trio.move_on_after(0.01) as scope:
            await tasks.run_sync(slow)
            await trio.sleep(0)  # the cancellation lands at the next checkpoint
        return scope.cancelled_caught

    assert trio.run(main) and finished == [True]


def test_many_jobs_at_once_each_wake_their_own_caller():
    async def main():
        out = {}

        async def one(i):
            out[i] = await tasks.run_sync(lambda: (time.sleep(0.001 * (i % 5)), i)[1])

        async with trio.open_nursery() as n:
            for i in range(50):
                n.start_soon(one, i)
        return out

    assert trio.run(main) == {i: i for i in range(50)}
