"""The kernel's native AIO interface (io_setup, io_submit, io_getevents) as ctypes: syscall
numbers, struct iocb, struct io_event. Shared by the trio thread's engine (kvfs/pool/linux_aio.py)
and the I/O worker processes (kvfs/pool/io_worker.py), which import nothing else of kvfs."""

from __future__ import annotations

import ctypes
import platform

# syscall numbers: io_setup, io_destroy, io_getevents, io_submit
NR = {"x86_64": (206, 207, 208, 209), "aarch64": (0, 1, 4, 2)}.get(platform.machine())

IOCB_CMD_FDSYNC = 3
IOCB_CMD_PREADV = 7
IOCB_CMD_PWRITEV = 8
IOCB_FLAG_RESFD = 1
RWF_NOWAIT = 0x8  # fail with EAGAIN rather than block (a file system's locks, allocation)


class IOCB(ctypes.Structure):  # struct iocb, little-endian layout
    _fields_ = [
        ("aio_data", ctypes.c_uint64),
        ("aio_key", ctypes.c_uint32),
        ("aio_rw_flags", ctypes.c_int32),
        ("aio_lio_opcode", ctypes.c_uint16),
        ("aio_reqprio", ctypes.c_int16),
        ("aio_fildes", ctypes.c_uint32),
        ("aio_buf", ctypes.c_uint64),
        ("aio_nbytes", ctypes.c_uint64),
        ("aio_offset", ctypes.c_int64),
        ("aio_reserved2", ctypes.c_uint64),
        ("aio_flags", ctypes.c_uint32),
        ("aio_resfd", ctypes.c_uint32),
    ]


class Event(ctypes.Structure):  # struct io_event
    _fields_ = [
        ("data", ctypes.c_uint64),
        ("obj", ctypes.c_uint64),
        ("res", ctypes.c_int64),
        ("res2", ctypes.c_int64),
    ]


class Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class Iovec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


libc = ctypes.PyDLL(None, use_errno=True)  # PyDLL: the GIL stays held (microsecond calls)
syscall = libc.syscall
syscall.restype = ctypes.c_long
