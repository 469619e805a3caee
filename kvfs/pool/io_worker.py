"""An I/O worker process: moves stripe units from the namespaces straight into block memory.

The daemon (kvfs/pool/io_workers.py) starts it as `python -m kvfs.pool.io_worker FD`, where FD
is its end of a SOCK_SEQPACKET socket pair. The first message names the namespaces (path and
whether they take O_DIRECT); the worker opens them itself, read-only. Every later message is a
*batch* of reads, each with the descriptor of the block's memory file attached (SCM_RIGHTS,
one per read, in order). For each read the worker maps the file, faults in the pages the units
land in, reads them with one O_DIRECT preadv by Linux AIO (so one process keeps every
namespace's queue at its depth), verifies each unit's xxh3-64 where it landed, zeroes its
padding, unmaps and closes the file, and answers: `[key, [units that failed their checksum]]`,
or `[key, None, errno, message]` when the read itself failed. Answers finished together go back
as one message.

The bytes are copied once, by the device into the block's own pages; the daemon's trio thread
sends one message per batch and reads one per batch of answers. Why a process, not threads of
the daemon: a thread shares the daemon's GIL, and handing it back and forth with the trio
thread at every syscall cost more than the I/O (docs/performance.md, "Small blocks by Linux
AIO"), while xxhash holds the GIL for the whole checksum.

The worker holds nothing the daemon needs after a crash: killed mid-batch, its reads are done
again by the daemon (the kernel finishes or cancels a dead process's AIO before its socket
closes). It exits when the daemon's end of the socket closes, and when the daemon dies
(PR_SET_PDEATHSIG). It imports nothing of kvfs beyond the kernel's AIO interface.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import select
import signal
import socket
import sys

import msgspec
import xxhash

from kvfs.pool import aio_abi as abi

MAX_FDS = 250  # descriptors one message carries at most (the kernel's SCM_MAX_FD is 253)
MAX_MESSAGE = 1 << 20  # bytes of one message at most, either way
DEPTH = 256  # reads in flight at once (io_setup's nr_events)
PAGE = 4096
MADV_POPULATE_WRITE = 23
PR_SET_PDEATHSIG = 1

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
MAP_FAILED = ctypes.c_void_p(-1).value


class Read:
    """One read in flight: the block file's mapping, the units' places in it, their checks."""

    __slots__ = (
        "key",
        "fd",
        "addr",
        "length",
        "spans",
        "checks",
        "ns",
        "offset",
        "iov",
        "cb",
        "places",
    )

    def __init__(self, key, fd, length, ns, offset, spans, checks):
        self.key, self.fd, self.length, self.ns, self.offset = key, fd, length, ns, offset
        self.spans, self.checks = spans, checks
        self.addr = None  # the file's mapping
        self.iov = self.cb = None
        self.places: list[int] = []  # where each unit lands (address)

    def map(self) -> None:
        """Map the block's file and make the iovecs of the read (the units' places in it)."""
        addr = _libc.mmap(
            None, self.length, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, self.fd, 0
        )
        if addr is None or addr == MAP_FAILED:
            e = ctypes.get_errno()
            raise OSError(e, f"mmap of a block's memory: {os.strerror(e)}")
        self.addr = addr
        self.iov = (abi.Iovec * len(self.spans))()
        for i, (start, stored, _) in enumerate(self.spans):
            self.places.append(addr + start)
            self.iov[i].iov_base = addr + start
            self.iov[i].iov_len = stored
            # fault in the pages first: a read into pages not yet present faults them in one
            # by one from inside the read, much slower (a spare's pages are there already)
            _libc.madvise(addr + start, stored, MADV_POPULATE_WRITE)

    @property
    def nbytes(self) -> int:
        return sum(stored for _, stored, _ in self.spans)

    def finish(self) -> list[int]:
        """Verify each unit's checksum where it landed and zero its padding; the units that
        failed theirs."""
        bad = []
        for i, (place, (_, stored, length), check) in enumerate(
            zip(self.places, self.spans, self.checks)
        ):
            if check is not None:
                n, digest = check
                if xxhash.xxh3_64_intdigest((ctypes.c_char * n).from_address(place)) != digest:
                    bad.append(i)
            if stored > length:  # past the content: zeros, whatever the padding held
                ctypes.memset(place + length, 0, stored - length)
        return bad

    def close(self) -> None:
        if self.addr is not None:
            _libc.munmap(self.addr, self.length)
            self.addr = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class Worker:
    def __init__(self, sock: socket.socket, namespaces: list[tuple[str, bool]]):
        self.sock = sock
        self.fds = []
        for path, direct in namespaces:
            if not path:  # a number removed from the pool: never read
                self.fds.append(-1)
                continue
            flags = os.O_RDONLY | os.O_CLOEXEC | (os.O_DIRECT if direct else 0)
            self.fds.append(os.open(path, flags))
        self.encoder = msgspec.msgpack.Encoder()
        self.decoder = msgspec.msgpack.Decoder()
        self.inflight: dict[int, Read] = {}
        self.answers: list = []
        self.next = 1
        self.ctx = None
        self.efd = -1
        if abi.NR is not None:
            ctx = ctypes.c_ulong(0)
            if abi.syscall(ctypes.c_long(abi.NR[0]), ctypes.c_long(DEPTH), ctypes.byref(ctx)) == 0:
                self.ctx = ctx
                self.efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
                self.events = (abi.Event * DEPTH)()
                self.zero = abi.Timespec(0, 0)

    def run(self) -> None:
        poll = select.poll()
        poll.register(self.sock, select.POLLIN)
        if self.efd >= 0:
            poll.register(self.efd, select.POLLIN)
        self.sock.setblocking(False)
        while True:
            for fd, _ in poll.poll():
                if fd == self.efd:
                    try:
                        os.eventfd_read(self.efd)
                    except BlockingIOError:
                        pass
                    self.collect()
                elif not self.receive():
                    return  # the daemon closed its end
            if self.answers:
                self.sock.setblocking(True)
                self.sock.send(self.encoder.encode(self.answers))
                self.sock.setblocking(False)
                self.answers = []

    def receive(self) -> bool:
        """Take every batch waiting on the socket; False once the daemon has gone."""
        while True:
            try:
                data, fds, _, _ = socket.recv_fds(self.sock, MAX_MESSAGE, MAX_FDS)
            except BlockingIOError:
                return True
            except ConnectionError:
                return False
            if not data:
                return False
            for (key, ns, offset, length, spans, checks), fd in zip(self.decoder.decode(data), fds):
                self.start(Read(key, fd, length, ns, offset, spans, checks))

    def start(self, r: Read) -> None:
        try:
            r.map()
            if self.ctx is None or not self.submit(r):
                self.read_sync(r, 0)
        except OSError as e:
            self.fail(r, e)

    def submit(self, r: Read) -> bool:
        """Queue the read by AIO; False if the kernel refused it (then it is read here)."""
        cb = abi.IOCB()
        cb.aio_data = r.key
        cb.aio_lio_opcode = abi.IOCB_CMD_PREADV
        cb.aio_fildes = self.fds[r.ns]
        cb.aio_buf = ctypes.addressof(r.iov)
        cb.aio_nbytes = len(r.spans)
        cb.aio_offset = r.offset
        cb.aio_flags = abi.IOCB_FLAG_RESFD
        cb.aio_resfd = self.efd
        r.cb = cb
        ptr = ctypes.pointer(cb)
        n = abi.syscall(ctypes.c_long(abi.NR[3]), self.ctx, ctypes.c_long(1), ctypes.byref(ptr))
        if n != 1:
            return False
        self.inflight[r.key] = r
        return True

    def collect(self) -> None:
        while self.inflight:
            n = abi.syscall(
                ctypes.c_long(abi.NR[2]),
                self.ctx,
                ctypes.c_long(0),
                ctypes.c_long(DEPTH),
                self.events,
                ctypes.byref(self.zero),
            )
            if n < 0:
                if ctypes.get_errno() == errno.EINTR:
                    continue
                raise OSError(ctypes.get_errno(), "io_getevents")
            for i in range(n):
                ev = self.events[i]
                r = self.inflight.pop(ev.data)
                if ev.res < 0:
                    self.fail(r, OSError(-ev.res, os.strerror(-ev.res)))
                else:
                    self.read_sync(r, ev.res)
            if n < DEPTH:
                return

    def read_sync(self, r: Read, done: int) -> None:
        """Finish a read from `done` bytes on (a short AIO, or none), then answer it."""
        try:
            total = r.nbytes
            while done < total:
                views, skip = [], done
                for place, (_, stored, _) in zip(r.places, r.spans):
                    if skip >= stored:
                        skip -= stored
                        continue
                    views.append((ctypes.c_char * (stored - skip)).from_address(place + skip))
                    skip = 0
                n = os.preadv(self.fds[r.ns], views, r.offset + done)
                if n <= 0:
                    raise OSError(errno.EIO, f"read ended {total - done} bytes short")
                done += n
            self.answers.append([r.key, r.finish()])
        except OSError as e:
            self.fail(r, e)
            return
        r.close()

    def fail(self, r: Read, e: OSError) -> None:
        r.close()
        self.answers.append([r.key, None, e.errno or errno.EIO, e.strerror or str(e)])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the daemon's terminal's ^C is the daemon's
    sock = socket.socket(fileno=int(argv[0]))
    hello = msgspec.msgpack.decode(sock.recv(MAX_MESSAGE))
    if os.getppid() != hello["daemon"]:
        return 0  # the daemon died before PR_SET_PDEATHSIG was set
    try:
        worker = Worker(sock, [(p, d) for p, d in hello["namespaces"]])
    except OSError as e:
        sock.send(msgspec.msgpack.encode({"error": f"{e.filename}: {e.strerror}"}))
        return 1
    sock.send(msgspec.msgpack.encode({"ok": os.getpid(), "aio": worker.ctx is not None}))
    worker.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
