"""kvfs.client.direct's connections to a mount's daemon: its direct socket
(kvfs/fs/direct_socket.py), found through the mount, one connection per thread.

The mount says where the socket is and which process serves it (`user.kvfs.direct` on its
root); a connection is used only once the kernel says its other end is that process
(SO_PEERCRED), so no other process can pose as the daemon. A request and its reply are frames
of kvfs/client/wire.py. A connection that breaks (the daemon restarted: a new socket) is made
again, once, after asking the mount again.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import struct
import threading
from typing import Any

import msgspec

from kvfs.client import wire

ATTR = "user.kvfs.direct"


class Channel:
    """One connection; one request at a time (its thread's)."""

    def __init__(self, address: str, pid: int):
        self.pid = os.getpid()  # (a forked child makes its own)
        self._encode = msgspec.msgpack.Encoder().encode
        self._decoders: dict[Any, msgspec.msgpack.Decoder] = {}
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            sock.connect(address)
            peer = struct.unpack("iII", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
            if peer[0] != pid:
                raise OSError(
                    errno.EPROTO,
                    f"the direct socket is served by process {peer[0]}, not the mount's ({pid})",
                )
            self.sock = sock
            welcome = self._receive(wire.Welcome | wire.Failure)
        except BaseException:
            sock.close()
            raise
        if isinstance(welcome, wire.Failure):
            self.close()
            raise OSError(welcome.errno, welcome.message)
        self.welcome: wire.Welcome = welcome

    def call(self, request: wire.Request, reply: Any) -> Any:
        """Send a request, return its reply (of type `reply`); a Failure of the whole request
        raises OSError, a broken connection ConnectionError."""
        self.sock.sendall(wire.frame(self._encode(request)))
        got = self._receive(reply | wire.Failure)
        if isinstance(got, wire.Failure):
            raise OSError(got.errno, got.message)
        return got

    def _receive(self, kind: Any) -> Any:
        decoder = self._decoders.get(kind)
        if decoder is None:
            decoder = self._decoders[kind] = msgspec.msgpack.Decoder(kind)
        try:
            n = wire.frame_length(self._exactly(wire.HEADER))
            return decoder.decode(self._exactly(n))
        except (ValueError, msgspec.DecodeError) as e:  # (not the daemon's protocol)
            raise ConnectionResetError(errno.EPROTO, f"a bad reply on the direct socket: {e}")

    def _exactly(self, n: int) -> bytearray:
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            k = self.sock.recv_into(view[got:])
            if k == 0:
                raise ConnectionResetError(errno.ECONNRESET, "the daemon closed the direct socket")
            got += k
        return buf

    def close(self) -> None:
        self.sock.close()


class Channels:
    """The connections of one `Direct` to one mount's daemon: one per thread (a thread's
    requests are answered in order; threads do not wait for each other), made when first
    needed, closed together."""

    def __init__(self, mountpoint: str):
        self.mountpoint = mountpoint
        self._where: tuple[str, int] | None = None
        self._open: dict[int, Channel] = {}  # by thread (an ended thread's is its successor's)
        self._lock = threading.Lock()

    def _locate(self, again: bool) -> tuple[str, int]:
        """The socket's address and its process, as the mount says."""
        where = self._where
        if where is None or again:
            try:
                raw = json.loads(os.getxattr(self.mountpoint, ATTR))
            except OSError as e:
                if e.errno in (errno.ENODATA, errno.ENOTSUP):
                    raise OSError(
                        e.errno,
                        f"{self.mountpoint} is not a kvfs mount serving direct access",
                        self.mountpoint,
                    ) from None
                raise
            if raw.get("version") != wire.VERSION:
                raise OSError(
                    errno.EPROTO,
                    f"the kvfs daemon at {self.mountpoint} speaks version {raw.get('version')} "
                    f"of the direct path, this client {wire.VERSION}",
                )
            address = raw["socket"]
            if address.startswith("@"):
                address = "\0" + address[1:]
            where = self._where = (address, raw["pid"])
        return where

    def paths_for(self, ch: Channel, blocks) -> list[str]:
        """The namespace paths of the pool as `ch`'s welcome names them, read again (one
        short-lived connection; `ch` and its leases stay) if one of `blocks` (replies with
        `ns`, or Failures) names a namespace newer than the welcome (`kvfs pool add`)."""
        paths = ch.welcome.namespace_paths
        highest = max((max(b.ns) for b in blocks if getattr(b, "ns", None)), default=0)
        if highest >= len(paths):
            fresh = Channel(*self._locate(False))
            fresh.close()
            ch.welcome = fresh.welcome
            paths = fresh.welcome.namespace_paths
        return paths

    def get(self, again: bool = False) -> Channel:
        """This thread's connection (a new one if `again`)."""
        key = threading.get_ident()
        ch = self._open.get(key)
        if ch is not None and (again or ch.pid != os.getpid()):
            self._drop(key, ch)
            ch = None
        if ch is None:
            ch = Channel(*self._locate(again))
            with self._lock:
                self._open[key] = ch
        return ch

    def call(self, request: wire.Request, reply: Any) -> Any:
        """`Channel.call` on this thread's connection; one that broke (or a socket that is
        gone: the daemon restarted) is made again, once, where the mount says now."""
        try:
            return self._call(request, reply, again=False)
        except ConnectionError:
            pass
        try:
            return self._call(request, reply, again=True)
        except ConnectionError as e:
            raise OSError(
                e.errno or errno.ECONNRESET,
                f"the kvfs daemon at {self.mountpoint}: {e.strerror or e}",
            ) from None

    def _call(self, request: wire.Request, reply: Any, again: bool) -> Any:
        ch = self.get(again)
        try:
            return ch.call(request, reply)
        except ConnectionError:
            self._drop(threading.get_ident(), ch)
            raise

    def _drop(self, key: int, ch: Channel) -> None:
        with self._lock:
            if self._open.get(key) is ch:
                del self._open[key]
        ch.close()

    def close(self) -> None:
        with self._lock:
            chans, self._open = list(self._open.values()), {}
        for ch in chans:
            ch.close()
