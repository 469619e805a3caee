"""One exception type that carries its errno, so every layer raises the same thing.

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
