"""A small Redis client for trio: RESP2 over a trio stream, with pipelining, Lua scripts and
pub/sub. kvfs talks to Redis from its trio thread, so a blocking client (redis-py) would stall
every FUSE request; this one awaits the socket instead.

    r = await RedisClient.connect("redis://:password@host:6379/0")   # rediss:// for TLS
    await r.call("SET", "k", "v")
    a, b = await r.pipeline([("GET", "k"), ("INCR", "n")])

Errors: `RedisError` for an error reply (the command ran and failed), `RedisUnavailable` when
the server cannot be reached or the connection broke (the caller decides whether to retry).
"""

from __future__ import annotations

import hashlib
import ssl
from typing import Any, Sequence
from urllib.parse import unquote, urlparse

import trio


class RedisError(Exception):
    """An error reply from Redis."""


class RedisUnavailable(ConnectionError):
    """Redis cannot be reached, or the connection broke."""


def _encode(args: Sequence[Any]) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        if isinstance(a, bytes):
            b = a
        elif isinstance(a, str):
            b = a.encode()
        elif isinstance(a, bool):
            b = b"1" if a else b"0"
        elif isinstance(a, (int, float)):
            b = repr(a).encode()
        else:
            raise TypeError(f"cannot send {type(a).__name__} to Redis")
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


class _Reader:
    def __init__(self, stream: trio.abc.Stream):
        self.stream = stream
        self.buf = bytearray()

    async def _fill(self) -> None:
        data = await self.stream.receive_some(65536)
        if not data:
            raise RedisUnavailable("connection closed by Redis")
        self.buf += data

    async def _line(self) -> bytes:
        while True:
            i = self.buf.find(b"\r\n")
            if i >= 0:
                line = bytes(self.buf[:i])
                del self.buf[: i + 2]
                return line
            await self._fill()

    async def _exact(self, n: int) -> bytes:
        while len(self.buf) < n + 2:
            await self._fill()
        data = bytes(self.buf[:n])
        del self.buf[: n + 2]
        return data

    async def read(self) -> Any:
        line = await self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest
        if kind == b"-":
            return RedisError(rest.decode(errors="replace"))
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else await self._exact(n)
        if kind == b"*":
            n = int(rest)
            if n < 0:
                return None
            return [await self.read() for _ in range(n)]
        raise RedisUnavailable(f"unexpected reply from Redis: {line[:40]!r}")


def reason(e: BaseException) -> str:
    """A one-line reason for a failed connection (trio wraps TLS errors without a message)."""
    if isinstance(e, trio.TooSlowError):
        return "timed out"
    inner = e.__cause__ or e.__context__
    if not str(e) and inner is not None:
        e = inner
    if isinstance(e, ssl.SSLError):
        return f"TLS: {getattr(e, 'verify_message', None) or e.reason or e}"
    return str(e) or type(e).__name__


class RedisClient:
    """One connection. Calls are serialized (a lock), so tasks can share it."""

    def __init__(self, stream: trio.abc.Stream, url: str):
        self.stream = stream
        self.url = url
        self._reader = _Reader(stream)
        self._lock = trio.Lock()
        self._scripts: dict[str, str] = {}
        self.closed = False
        self.round_trips = 0  # pipelines sent (a call is one)

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        timeout: float = 5.0,
        tls: ssl.SSLContext | None = None,
        password: str | None = None,
        address: tuple[str, int] | None = None,
    ) -> "RedisClient":
        """`address` (host, port) overrides the URL's (a master Sentinel named); the URL still
        gives the scheme, the credentials and the database."""
        u = urlparse(url)
        if u.scheme not in ("redis", "rediss"):
            raise ValueError(f"not a redis:// or rediss:// URL: {url}")
        host, port = address or (u.hostname or "127.0.0.1", u.port or 6379)
        stream: trio.abc.Stream | None = None
        try:
            with trio.fail_after(timeout):
                stream = await trio.open_tcp_stream(host, port)
                if u.scheme == "rediss":
                    ctx = tls or ssl.create_default_context()
                    stream = trio.SSLStream(stream, ctx, server_hostname=host)
                    await stream.do_handshake()
        except (OSError, trio.TooSlowError, trio.BrokenResourceError, ssl.SSLError) as e:
            if stream is not None:
                await trio.aclose_forcefully(stream)
            raise RedisUnavailable(f"cannot reach Redis at {host}:{port}: {reason(e)}") from None
        client = cls(stream, url)
        pw = password if password is not None else (unquote(u.password) if u.password else None)
        try:
            # a server that accepts connections but does not answer must not hang us either
            with trio.fail_after(timeout):
                if pw:
                    args = ["AUTH", unquote(u.username), pw] if u.username else ["AUTH", pw]
                    try:
                        await client.call(*args)
                    except RedisError as e:
                        raise RedisUnavailable(
                            f"Redis at {host}:{port} refused the password: {e}"
                        ) from None
                db = (u.path or "/").strip("/")
                if db:
                    await client.call("SELECT", int(db))
        except trio.TooSlowError:
            client.abort()
            raise RedisUnavailable(
                f"Redis at {host}:{port} accepted the connection but did not "
                f"answer within {timeout:.0f} s"
            ) from None
        except BaseException:
            await client.aclose()
            raise
        return client

    def abort(self) -> None:
        """Close the socket now (synchronous: usable while being cancelled)."""
        self.closed = True
        s = self.stream
        while hasattr(s, "transport_stream"):
            s = s.transport_stream
        sock = getattr(s, "socket", None)
        if sock is not None:
            sock.close()

    async def aclose(self) -> None:
        self.closed = True
        try:
            await self.stream.aclose()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass

    async def _send(self, payload: bytes) -> None:
        try:
            await self.stream.send_all(payload)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as e:
            self.closed = True
            raise RedisUnavailable(f"lost the connection to Redis: {e}") from None

    async def _recv(self) -> Any:
        try:
            return await self._reader.read()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as e:
            self.closed = True
            raise RedisUnavailable(f"lost the connection to Redis: {e}") from None

    async def pipeline(
        self, commands: Sequence[Sequence[Any]], *, raise_errors: bool = True
    ) -> list:
        """Send commands in one round trip; returns their replies in order."""
        if self.closed:
            raise RedisUnavailable("the connection to Redis is closed")
        async with self._lock:
            self.round_trips += 1
            try:
                await self._send(b"".join(_encode(c) for c in commands))
                replies = [await self._recv() for _ in commands]
            except BaseException:
                self.abort()  # a reply may be half read: this connection is done
                raise
        if raise_errors:
            for r in replies:
                if isinstance(r, RedisError):
                    raise r
        return replies

    async def call(self, *args: Any) -> Any:
        return (await self.pipeline([args]))[0]

    async def eval(
        self,
        script: str,
        keys: Sequence[Any],
        args: Sequence[Any],
        *,
        wait: tuple[int, int] | None = None,
    ) -> Any:
        """Run a Lua script (by its SHA once loaded). With `wait` (replicas, milliseconds), a
        WAIT follows in the same round trip and the reply is (script's reply, replicas that
        acknowledged everything this connection wrote)."""
        sha = self._scripts.get(script)
        if sha is None:
            sha = hashlib.sha1(script.encode()).hexdigest()
            self._scripts[script] = sha
        tail = [("WAIT", *wait)] if wait else []
        replies = await self.pipeline(
            [("EVALSHA", sha, len(keys), *keys, *args), *tail], raise_errors=False
        )
        if isinstance(replies[0], RedisError) and str(replies[0]).startswith("NOSCRIPT"):
            replies = await self.pipeline(
                [("EVAL", script, len(keys), *keys, *args), *tail], raise_errors=False
            )
        for r in replies:
            if isinstance(r, RedisError):
                raise r
        return (replies[0], replies[1]) if wait else replies[0]
