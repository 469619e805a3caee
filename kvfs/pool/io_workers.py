"""The daemon's side of its I/O worker processes (kvfs/pool/io_worker.py): cold reads off the
trio thread, moved once.

A fetch's stripe units go from the namespaces straight into the block's own memory file (the
DRAM tier's buffer, whose pages a spare already has: kvfs/pool/buffer.py), read and verified by
a worker process that opened the namespaces itself. The trio thread only describes each read
(namespace, offset, where each unit lands in the file, its checksum) and hands over the file's
descriptor. `IoWorkers.read` queues the read and parks its task; a sender task per worker sends
everything queued since it last ran as one message (SCM_RIGHTS carries the descriptors), and a
receiver task wakes every task whose answer came in the worker's last message. So a burst of
cold loads costs the trio thread one send and one receive per batch, not a thread hop each.

Failure: a read the device failed comes back as its OSError (the namespace marks itself as it
did before). A worker that dies (killed, out of memory) fails every read it had in flight with
`WorkerLost`; the namespace reads those again itself (the pool's in-process path), the worker
is started again, and the mount goes on serving. Nothing a worker holds is needed for a commit:
it only reads.

`[pool] io_workers` sets how many (0: every read on the daemon's own threads, as before).
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import subprocess
import sys
import time

import msgspec
import outcome
import trio

from kvfs.pool.io_worker import MAX_FDS, MAX_MESSAGE

log = logging.getLogger("kvfs.pool.io_workers")

START_TIMEOUT = 30.0  # seconds a new worker may take to say it is ready


class WorkerLost(OSError):
    """The worker died with this read in flight: nothing was read for it."""

    def __init__(self, why: str):
        super().__init__(errno.EIO, why)


class _Worker:
    """One worker process, its socket, and the reads it has been given."""

    __slots__ = ("proc", "sock", "waiting", "outbox", "lot", "pid")

    def __init__(self, proc: subprocess.Popen, sock: socket.socket):
        self.proc = proc
        self.sock = sock
        self.pid = proc.pid
        self.waiting: dict[int, trio.lowlevel.Task] = {}
        self.outbox: list[tuple[list, int]] = []  # (read, the block file's descriptor)
        self.lot = trio.lowlevel.ParkingLot()


class IoWorkers:
    """`count` worker processes reading the namespaces at `paths` ((path, O_DIRECT or not))."""

    def __init__(self, paths: list[tuple[str, bool]], count: int):
        self.paths = paths
        self.count = count
        self.live: list[_Worker] = []
        self.disabled: str | None = None  # why no worker could be started
        self._next = 1
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder()
        self.reads = 0
        self.batches = 0  # messages sent
        self.answers = 0  # messages received
        self.restarts = 0
        self.lost = 0  # reads a dying worker had in flight (read again by the namespace)

    def statistics(self) -> dict:
        return {
            "count": self.count,
            "live": [w.pid for w in self.live],
            "disabled": self.disabled,
            "reads": self.reads,
            "batches": self.batches,
            "answer_batches": self.answers,
            "restarts": self.restarts,
            "lost": self.lost,
        }

    @property
    def ready(self) -> bool:
        return bool(self.live)

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Keep `count` workers running until cancelled; started() once the first attempt to
        start each has ended (reads go to the namespaces' own threads while none runs)."""
        async with trio.open_nursery() as nursery:
            for _ in range(self.count):
                await nursery.start(self._keep_one)
            task_status.started()

    async def _keep_one(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        failures = 0
        while True:
            try:
                w = await trio.to_thread.run_sync(self._spawn)
            except OSError as e:
                failures += 1
                self.disabled = f"cannot start an I/O worker: {e.strerror or e}"
                log.error("%s; reads stay on the daemon's threads", self.disabled)
                task_status.started()
                task_status = trio.TASK_STATUS_IGNORED
                await trio.sleep(min(60.0, 2.0**failures))
                continue
            self.disabled = None
            self.live.append(w)
            task_status.started()
            task_status = trio.TASK_STATUS_IGNORED
            began = time.monotonic()
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._send, w)
                    await self._receive(w)
                    nursery.cancel_scope.cancel()
            finally:
                with trio.CancelScope(shield=True):
                    await self._lost(w)
            self.restarts += 1
            failures = failures + 1 if time.monotonic() - began < 5.0 else 0
            log.warning(
                "I/O worker %d ended (exit status %s); its reads are done again here, "
                "and a new worker starts",
                w.pid,
                w.proc.returncode,
            )
            if failures:
                await trio.sleep(min(30.0, 0.1 * 2.0**failures))

    def _spawn(self) -> _Worker:
        """In a thread: start a worker and wait until it has opened the namespaces."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "kvfs.pool.io_worker", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
            )
        except OSError:
            ours.close()
            raise
        finally:
            theirs.close()
        try:
            ours.sendall(
                msgspec.msgpack.encode(
                    {"daemon": os.getpid(), "namespaces": [[p, d] for p, d in self.paths]}
                )
            )
            ours.settimeout(START_TIMEOUT)
            hello = msgspec.msgpack.decode(ours.recv(MAX_MESSAGE) or msgspec.msgpack.encode({}))
            if "ok" not in hello:
                raise OSError(errno.EIO, hello.get("error", "the worker exited at start"))
        except (OSError, msgspec.DecodeError) as e:
            ours.close()
            proc.kill()
            proc.wait()
            if isinstance(e, OSError):
                raise
            raise OSError(errno.EIO, f"the worker said nothing intelligible: {e}") from None
        ours.setblocking(False)
        return _Worker(proc, ours)

    async def _lost(self, w: _Worker) -> None:
        """A worker's socket closed (or the mount stops): reap the process, then fail its
        reads in flight, which are read again elsewhere into the same memory. Only once it is
        reaped: a process's AIO has ended when it has (one killed in the middle of a read of a
        stalled device ends only when the read does)."""
        if w in self.live:
            self.live.remove(w)
        w.sock.close()
        if w.proc.poll() is None:
            w.proc.kill()
            await trio.to_thread.run_sync(w.proc.wait)
        waiting, w.waiting, w.outbox = w.waiting, {}, []
        self.lost += len(waiting)
        self._fail(waiting.values(), f"I/O worker {w.pid} ended mid-read")

    @staticmethod
    def _fail(tasks, why: str) -> None:
        for task in tasks:
            trio.lowlevel.reschedule(task, outcome.Error(WorkerLost(why)))

    def restart(self) -> None:
        """End every worker; each is started again with `paths` as they are now (a namespace
        was added). Their reads in flight are read again here (`WorkerLost`)."""
        for w in self.live:
            if w.proc.poll() is None:
                w.proc.kill()

    def close(self) -> None:
        """Stop every worker (outside trio: the pool's close)."""
        for w in list(self.live):
            w.sock.close()
            try:
                w.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                w.proc.kill()
                w.proc.wait()
        self.live.clear()

    async def read(
        self, ns: int, offset: int, fd: int, length: int, spans: list, checks: list
    ) -> list[int]:
        """Read units that lie back to back on namespace `ns` from `offset` into the file `fd`
        (`length` bytes long) at `spans` ((start, stored length, content length) each), and
        verify `checks` ((length, xxh3-64) or None each); the indices of the units that failed
        their checksum. Raises the read's OSError, or WorkerLost (read nothing: do it
        elsewhere). Not cancellable once queued: the worker writes into the file until it
        answers."""
        live = self.live
        if not live:
            raise WorkerLost("no I/O worker is running")
        w = live[0] if len(live) == 1 else min(live, key=lambda x: len(x.waiting))
        key = self._next
        self._next += 1
        w.outbox.append(([key, ns, offset, length, spans, checks], fd))
        w.waiting[key] = trio.lowlevel.current_task()
        w.lot.unpark()
        self.reads += 1
        return await trio.lowlevel.wait_task_rescheduled(lambda _: trio.lowlevel.Abort.FAILED)

    async def _send(self, w: _Worker) -> None:
        """Send what is queued for `w`, one message per batch, until cancelled."""
        while True:
            if not w.outbox:
                await w.lot.park()
                continue
            batch, w.outbox = w.outbox[:MAX_FDS], w.outbox[MAX_FDS:]
            data = self._encoder.encode([r for r, _ in batch])
            fds = [fd for _, fd in batch]
            while True:
                try:
                    socket.send_fds(w.sock, [data], fds)
                    self.batches += 1
                    break
                except BlockingIOError:
                    await trio.lowlevel.wait_writable(w.sock)
                except OSError as e:
                    # not sent: these reads are done elsewhere (if the worker is gone, the
                    # receiver sees its socket close and fails the rest)
                    lost = [w.waiting.pop(r[0]) for r, _ in batch if r[0] in w.waiting]
                    self.lost += len(lost)
                    self._fail(lost, f"a batch for I/O worker {w.pid} was not sent: {e}")
                    break

    async def _receive(self, w: _Worker) -> None:
        """Wake the tasks whose answers come in, until the worker's socket closes."""
        sock, waiting, decode = w.sock, w.waiting, self._decoder.decode
        while True:
            await trio.lowlevel.wait_readable(sock)
            while True:
                try:
                    data = sock.recv(MAX_MESSAGE)
                except BlockingIOError:
                    break
                except OSError:
                    return
                if not data:
                    return
                self.answers += 1
                for answer in decode(data):
                    task = waiting.pop(answer[0], None)
                    if task is None:
                        continue
                    if answer[1] is None:
                        result = outcome.Error(OSError(answer[2], answer[3]))
                    else:
                        result = outcome.Value(answer[1])
                    trio.lowlevel.reschedule(task, result)
