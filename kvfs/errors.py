"""One exception type that carries its errno, so every layer raises the same thing; and the
failures that carry more than an errno, each a class with its fields declared here (read them
with isinstance, never getattr: tests/unit/test_structure.py checks).

The FUSE layer turns a `KvfsError` into `pyfuse3.FUSEError(err.errno)` (and logs the message
at debug level); the CLI prints the message on one line and exits non-zero. Anything that is
not a `KvfsError` reaching the FUSE layer is a bug: it is logged with its traceback and the
request gets EIO.
"""

from __future__ import annotations

import errno as _errno


class KvfsError(Exception):
    """An error with an errno and a one-line message that names the problem."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.errno = code

    def __str__(self) -> str:
        return self.args[0]


def not_found(what: str) -> KvfsError:
    return KvfsError(_errno.ENOENT, f"no such file or directory: {what}")


def exists(what: str) -> KvfsError:
    return KvfsError(_errno.EEXIST, f"already exists: {what}")


def no_space(message: str) -> KvfsError:
    return KvfsError(_errno.ENOSPC, message)


class ConfigError(KvfsError):
    """A bad configuration file, key or value. The message names the key."""

    def __init__(self, message: str):
        super().__init__(_errno.EINVAL, message)


class StartupError(KvfsError):
    """A reason not to start (or to refuse a command) found before anything was changed."""

    def __init__(self, message: str, code: int = _errno.EINVAL):
        super().__init__(code, message)


class DeviceError(KvfsError):
    """A namespace's device failed an I/O (EIO, a device that ended, a short transfer, no
    answer within a write's deadline): the namespace is failed, and a block may be placed
    elsewhere (kvfs/pool/placement.py). An open of a block it could not read answers ENOENT
    (`as_missing`), as for `Unreadable`. `pending`: for an I/O past its deadline, a
    trio.Event set when it ends (until then it owns its memory and the extents it writes:
    Namespace.bounded, Pool.release_after)."""

    def __init__(self, message: str, namespace: int, pending=None):
        super().__init__(_errno.EIO, message)
        self.namespace = namespace
        self.pending = pending

    def as_missing(self) -> KvfsError:
        return KvfsError(_errno.ENOENT, str(self))


class Unreadable(KvfsError):
    """A block the pool cannot give in time: a namespace holding some of its units did not
    answer within `[pool] read_timeout_ms`, or is failed for reads since it did not (no new
    wait). EIO by default; an open of such a block answers ENOENT (`as_missing`): the answer
    the most engines turn into a cache miss (docs/configuration.md, "Reads under faults", says
    which do and which do not)."""

    def __init__(self, message: str, namespaces: tuple[int, ...], waited: bool):
        super().__init__(_errno.EIO, message)
        self.namespaces = namespaces  # the namespaces it waited for, or found failed
        self.waited = waited  # True: it waited out the deadline; False: failed at once

    def as_missing(self) -> KvfsError:
        """The same failure as ENOENT: the block is absent for this open."""
        return KvfsError(_errno.ENOENT, str(self))


class Dropped(KvfsError):
    """A write or commit that failed, and dropped what was written (Sessions.drop): the
    errno and message of `cause`; `dropped`, the inode (the kernel may cache the size its
    writes made); `removed`, (parent, name, inode) when a file never committed lost its
    name too (the kernel may cache the name)."""

    def __init__(
        self, cause: KvfsError, dropped: int, removed: tuple[int, bytes, int] | None = None
    ):
        super().__init__(cause.errno, str(cause))
        self.cause = cause
        self.dropped = dropped
        self.removed = removed


class Unsure(KvfsError):
    """A change sent to the shared catalog (Redis) that failed without its outcome being
    known from the reply (EIO). `maybe_done`: the reply was lost, the command may have run;
    `unreplicated`: it ran on the master and no replica confirmed it; `maybe_published`: a
    publish may have made its blocks visible (their space stays taken); `not_run`: Redis said
    afterwards that it did not run (it may be sent again)."""

    def __init__(self, message: str, *, maybe_done: bool = False, unreplicated: bool = False):
        super().__init__(_errno.EIO, message)
        self.maybe_done = maybe_done
        self.unreplicated = unreplicated
        self.maybe_published = False
        self.not_run = False
