"""kvfs.tasks.Lock: a free lock is taken without yielding; contended, it is FIFO and survives
cancellation of its waiters."""

import trio
import trio.testing

from kvfs.tasks import Lock


def test_a_free_lock_is_taken_without_a_checkpoint():
    async def main():
        lock = Lock()
        with trio.testing.assert_no_checkpoints():
            async with lock:
                assert lock.locked()
        assert not lock.locked()

    trio.run(main)


def test_waiters_get_the_lock_in_order_and_one_at_a_time():
    async def main():
        lock, order, inside = Lock(), [], [0]

        async def worker(i):
            async with lock:
                inside[0] += 1
                assert inside[0] == 1
                order.append(i)
                await trio.sleep(0.001)
                inside[0] -= 1

        async with trio.open_nursery() as n:
            async with lock:
                for i in range(5):
                    n.start_soon(worker, i)
                    await trio.testing.wait_all_tasks_blocked()
        assert order == [0, 1, 2, 3, 4] and not lock.locked()

    trio.run(main)


def test_a_cancelled_waiter_leaves_the_queue_and_the_lock_goes_on():
    async def main():
        lock, got = Lock(), []

        async def waiter(name, scope_box=None):
            with trio.CancelScope() as scope:
                if scope_box is not None:
                    scope_box.append(scope)
                async with lock:
                    got.append(name)

        async with trio.open_nursery() as n:
            box = []
            async with lock:
                n.start_soon(waiter, "cancelled", box)
                await trio.testing.wait_all_tasks_blocked()
                n.start_soon(waiter, "next")
                await trio.testing.wait_all_tasks_blocked()
                box[0].cancel()
                await trio.testing.wait_all_tasks_blocked()
        assert got == ["next"] and not lock.locked()

    trio.run(main)
