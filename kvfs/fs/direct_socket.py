"""The daemon's direct socket: where kvfs.client.direct sends its batches (kvfs/client/wire.py),
so that leasing, allocating or committing N blocks is one request to the daemon, not FUSE
requests per block (each FUSE request costs the trio thread tens of microseconds before kvfs
does anything: docs/architecture.md, "Direct access", says why a socket and not the control
file). Like the FUSE layer it only translates: requests to DirectAccess calls, their results
and KvfsErrors (errno and one line) to replies.

The socket is an abstract unix socket (no file to leave behind or to make reachable, no path
length to mind), named afresh for each run of the daemon and told through the mount
(`user.kvfs.direct` on its root, kvfs/fs/control.py), so a client finds it where it finds the
mount, and checks that the process answering is the one the mount named. Who asks is the
kernel's word: the peer's credentials when it connects (SO_PEERCRED, and its supplementary
groups: SO_PEERGROUPS); without `[mount] allow_other` only the mount's owner may connect, as
only the owner may use the mount. A connection's leases end when it closes.

Bad input never ends the daemon: a request that is not one (malformed msgpack, an unknown kind,
a value out of range) is answered with one Failure (EINVAL, one line); a frame longer than
wire.MAX_FRAME ends its connection after that answer; anything unexpected is logged and ends
only its connection.
"""

from __future__ import annotations

import collections
import errno
import logging
import os
import socket
import struct
from dataclasses import dataclass, field

import msgspec
import trio

from kvfs.client import wire
from kvfs.errors import KvfsError
from kvfs.fs.direct_access import DirectAccess
from kvfs.fs.leases import Allocation, Lease
from kvfs.fs.permissions import Caller

log = logging.getLogger("kvfs.fs.direct")

SO_PEERGROUPS = getattr(socket, "SO_PEERGROUPS", 59)  # (Linux 4.13; Python names it from 3.13)
GROUPS_MAX = 256  # supplementary groups read from a peer (getsockopt takes 1,024 bytes at most)


@dataclass
class DirectStats:
    connections: int = 0  # accepted, since the start
    connections_open: int = 0
    refused: int = 0  # another user's, without allow_other
    bad_requests: int = 0
    requests: collections.Counter = field(default_factory=collections.Counter)  # by kind
    blocks: collections.Counter = field(default_factory=collections.Counter)  # by kind


def peer(sock) -> Caller:
    """The credentials of the process at the other end, as the kernel took them at its
    connect(). More than GROUPS_MAX supplementary groups: none are taken (its access may be
    refused where the mount would allow it, never allowed where the mount would refuse)."""
    pid, uid, gid = struct.unpack("iII", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, SO_PEERGROUPS, 4 * GROUPS_MAX)
        groups = frozenset(struct.unpack(f"{len(raw) // 4}I", raw[: len(raw) // 4 * 4]))
    except OSError:
        groups = frozenset()
    return Caller(pid, uid, gid, groups)


class _Frames:
    """The frames arriving on a stream, one at a time."""

    def __init__(self, stream: trio.SocketStream):
        self.stream = stream
        self.buf = bytearray()

    async def next(self) -> bytes | None:
        """The next frame's body; None at the end of the stream. ValueError for a frame
        longer than wire.MAX_FRAME."""
        buf = self.buf
        need = wire.HEADER
        while True:
            if len(buf) >= wire.HEADER:
                n = wire.frame_length(bytes(buf[: wire.HEADER]))
                if len(buf) >= wire.HEADER + n:
                    body = bytes(buf[wire.HEADER : wire.HEADER + n])
                    del buf[: wire.HEADER + n]
                    return body
                need = wire.HEADER + n - len(buf)
            chunk = await self.stream.receive_some(min(max(need, 1 << 16), 1 << 20))
            if not chunk:
                return None
            buf += chunk


def _failure(e: KvfsError) -> wire.Failure:
    return wire.Failure(e.errno, str(e))


class DirectSocket:
    def __init__(
        self,
        direct: DirectAccess,
        *,
        allow_other: bool,
        namespace_paths: list[str],
        read_timeout: float | None,
    ):
        self.direct = direct
        self.allow_other = allow_other
        self.owner = os.geteuid()
        self.name = f"kvfs-direct-{os.getpid()}-{os.urandom(8).hex()}"
        self.listening = False
        self.welcome = wire.Welcome(wire.VERSION, namespace_paths, read_timeout)
        self.stats = DirectStats()
        self._next = 1  # connections are numbered: a lease's owner
        self._accepting = trio.CancelScope()
        self._idle: set[trio.CancelScope] = set()  # connections waiting for a request
        self._stopping = False
        self._encode = msgspec.msgpack.Encoder().encode
        self._decode = msgspec.msgpack.Decoder(wire.Request).decode

    @property
    def address(self) -> str:
        """Where clients connect ('@' for the abstract namespace's leading NUL)."""
        return "@" + self.name

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Listen, then serve every connection until cancelled or stopped (`stop`)."""
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with sock:
            await sock.bind("\0" + self.name)
            sock.listen(128)
            self.listening = True
            try:
                async with trio.open_nursery() as connections:
                    with self._accepting:
                        task_status.started()
                        await trio.serve_listeners(
                            self._connection,
                            [trio.SocketListener(sock)],
                            handler_nursery=connections,
                        )
            finally:
                self.listening = False

    async def stop(self, timeout: float = 10.0) -> None:
        """Unmounting: no new connection or request; a request being answered is answered
        (a commit half done would leave its blocks under their temporary names), for
        `timeout` seconds at most."""
        self._stopping = True
        self._accepting.cancel()
        for idle in list(self._idle):
            idle.cancel()
        with trio.move_on_after(timeout):
            while self.stats.connections_open:
                await trio.sleep(0.01)

    async def _connection(self, stream: trio.SocketStream) -> None:
        owner = self._next
        self._next += 1
        st = self.stats
        st.connections += 1
        st.connections_open += 1
        try:
            async with stream:
                caller = peer(stream.socket)
                if not self.allow_other and caller.uid != self.owner:
                    st.refused += 1
                    await self._send(
                        stream,
                        wire.Failure(
                            errno.EACCES,
                            f"only the mount's owner (uid {self.owner}) may use it: it is "
                            f"mounted without allow_other",
                        ),
                    )
                    return
                await self._send(stream, self.welcome)
                frames = _Frames(stream)
                while not self._stopping:
                    with trio.CancelScope() as idle:  # (`stop` ends the wait for a request)
                        self._idle.add(idle)
                        try:
                            body = await frames.next()
                        except ValueError as e:
                            st.bad_requests += 1
                            reply = wire.Failure(errno.EINVAL, f"bad request: {e}")
                            await self._send(stream, reply)
                            return
                        finally:
                            self._idle.discard(idle)
                    if idle.cancelled_caught or body is None:
                        return
                    await self._send(stream, await self._answer(body, caller, owner))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the client went away
        except Exception:  # noqa: BLE001 - one connection's end, never the daemon's
            log.exception("direct socket: connection %d failed", owner)
        finally:
            st.connections_open -= 1
            n = self.direct.disconnected(owner)
            if n:
                log.debug("direct socket: connection %d closed holding %d lease(s)", owner, n)

    async def _send(self, stream: trio.SocketStream, reply: wire.Reply) -> None:
        await stream.send_all(wire.frame(self._encode(reply)))

    async def _answer(self, body: bytes, caller: Caller, owner: int) -> wire.Reply:
        try:
            req = self._decode(body)
        except msgspec.DecodeError as e:  # (and ValidationError: a value out of range)
            self.stats.bad_requests += 1
            return wire.Failure(errno.EINVAL, f"bad request: {e}")
        kind = type(req).__name__.lower()
        self.stats.requests[kind] += 1
        direct = self.direct
        try:
            if isinstance(req, wire.Inspect):
                self.stats.blocks[kind] += len(req.paths)
                seen = await direct.inspect(caller, req.paths, req.xattrs)
                return wire.Inspected(
                    [_failure(x) if isinstance(x, KvfsError) else wire.FileInfo(*x) for x in seen]
                )
            if isinstance(req, wire.Lease):
                self.stats.blocks[kind] += len(req.paths)
                leased = await direct.lease(caller, owner, req.paths, req.ttl)
                return wire.Leased(
                    [_block(x) if isinstance(x, Lease) else _failure(x) for x in leased]
                )
            if isinstance(req, wire.Release):
                self.stats.blocks[kind] += len(req.leases)
                done = direct.release(owner, req.leases, req.hits)
                return wire.Results([None if x is None else _failure(x) for x in done])
            if isinstance(req, wire.Stalled):
                direct.stalled(owner, req.lease, req.namespace, req.offset, req.length)
                return wire.Results([None])
            if isinstance(req, wire.Alloc):
                self.stats.blocks[kind] += len(req.targets)
                targets = [(t.path, t.size, t.mode, t.xattrs) for t in req.targets]
                placed = await direct.allocate(caller, owner, targets, req.ttl)
                return wire.Allocated(
                    [_placement(x) if isinstance(x, Allocation) else _failure(x) for x in placed]
                )
            self.stats.blocks[kind] += len(req.allocs)
            if len(req.allocs) != len(req.sums):
                raise KvfsError(
                    errno.EINVAL, "a commit names as many checksum lists as allocations"
                )
            done = await direct.commit(caller, owner, list(zip(req.allocs, req.sums)))
            return wire.Results([None if x is None else _failure(x) for x in done])
        except KvfsError as e:
            return _failure(e)

    def statistics(self) -> dict:
        st = self.stats
        return {
            "socket": self.address if self.listening else None,
            "connections": st.connections,
            "connections_open": st.connections_open,
            "refused": st.refused,
            "bad_requests": st.bad_requests,
            "requests": dict(st.requests),
            "blocks": dict(st.blocks),
        }


def _block(lease: Lease) -> wire.Block:
    lay = lease.rec.layout
    return wire.Block(
        lease.id, lease.rec.id, lay.size, lay.unit, list(lay.ns), list(lay.offsets), list(lay.sums)
    )


def _placement(a: Allocation) -> wire.Placement:
    lay = a.layout
    return wire.Placement(
        a.id,
        lay.unit,
        list(lay.ns),
        list(lay.offsets),
        round(max(0.0, a.expires - trio.current_time()), 3),
    )
