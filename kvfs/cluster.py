"""The connection of one node to its cluster's Redis: a few connections, reconnects, and one
place that turns "Redis is unreachable" into EIO with a clear log line.

Every key of a pool lives under one prefix, `kvfs:{<name>}:`: the braces are a Redis Cluster
hash tag, so all of a pool's keys share one slot and its Lua scripts stay atomic there too.
See docs/cluster.md for the keys and the protocol.
"""

from __future__ import annotations

import errno
import logging
import ssl
import time
from typing import Any, Sequence

import trio

from kvfs.config import ClusterConfig
from kvfs.errors import KvfsError, StartupError
from kvfs.redis_client import RedisClient, RedisError, RedisUnavailable

log = logging.getLogger("kvfs.cluster")

CONNECTIONS = 4            # calls in flight to Redis at once (each connection is sequential)
RECONNECT_SECONDS = 0.5    # between attempts while Redis is unreachable
CALL_TIMEOUT = 5.0         # a call that takes longer is treated as Redis being unreachable

# Error replies our scripts raise: "<ERRNO> message" -> the errno the caller gets.
_ERRNOS = {name: getattr(errno, name) for name in
           ("ENOENT", "EEXIST", "ENOTEMPTY", "EISDIR", "ENOTDIR", "EINVAL", "ESTALE", "EIO")}


def _password(cfg: ClusterConfig) -> str | None:
    if cfg.password_file is not None:
        try:
            return cfg.password_file.read_text().strip()
        except OSError as e:
            raise StartupError(f"cluster.password_file {cfg.password_file}: {e.strerror}") from None
    return cfg.password


def _tls(cfg: ClusterConfig) -> ssl.SSLContext | None:
    if not cfg.redis.startswith("rediss://"):
        return None
    try:
        ctx = ssl.create_default_context(cafile=str(cfg.tls_ca) if cfg.tls_ca else None)
        if cfg.tls_cert is not None:
            ctx.load_cert_chain(str(cfg.tls_cert), str(cfg.tls_key))
    except (OSError, ssl.SSLError) as e:
        raise StartupError(f"cluster: TLS set-up failed: {e}") from None
    return ctx


class ClusterLink:
    """Shared by the catalog's tasks. `online` is False from the first failed call until a call
    succeeds again; the transitions are logged once each."""

    def __init__(self, cfg: ClusterConfig):
        self.cfg = cfg
        self.prefix = f"kvfs:{{{cfg.name}}}:"
        self.password = _password(cfg)
        self.tls = _tls(cfg)
        self._idle: list[RedisClient] = []
        self._slots = trio.Semaphore(CONNECTIONS)
        self.online = True
        self.quiet = False              # start-up: failures become one StartupError, not logs
        self.down_since: float | None = None
        self._next_attempt = 0.0
        self.calls = 0
        self.call_seconds = 0.0
        self.failures = 0
        self.epoch = 0                  # this mount's epoch and lease token (bootstrap.join)
        self.token = ""

    @property
    def where(self) -> str:
        return self.cfg.where

    def key(self, *parts: Any) -> str:
        return self.prefix + ":".join(str(p) for p in parts)

    async def connect(self) -> RedisClient:
        """A new dedicated connection (the event follower uses one); RedisUnavailable if down."""
        return await RedisClient.connect(self.cfg.redis, tls=self.tls, password=self.password,
                                         timeout=CALL_TIMEOUT)

    # --- state transitions ---------------------------------------------------------------------
    def mark_down(self, why: str, *, attempted: bool = True) -> KvfsError:
        """Redis failed us (`why`: a reason that names Redis); the error to raise."""
        if attempted:
            self.failures += 1
            self._next_attempt = trio.current_time() + RECONNECT_SECONDS
        if self.online:
            self.online = False
            self.down_since = trio.current_time()
            if not self.quiet:
                log.error("cluster: Redis at %s is unreachable (%s): lookups of names this node "
                          "does not know and all changes fail with EIO until it is back; open and "
                          "DRAM-resident blocks keep being served", self.where, why)
        return KvfsError(errno.EIO, f"cluster catalog unavailable: {why}")

    def _up(self) -> None:
        if not self.online and not self.quiet:
            log.warning("cluster: Redis at %s is reachable again after %.1f s", self.where,
                        trio.current_time() - (self.down_since or trio.current_time()))
        self.online = True
        self.down_since = None

    # --- connections ---------------------------------------------------------------------------
    async def _run(self, fn) -> Any:
        """Run fn(connection) on an idle connection (opening one if needed); translate errors."""
        async with self._slots:
            if self._idle:
                c = self._idle.pop()
            else:
                if not self.online and trio.current_time() < self._next_attempt:
                    raise self.mark_down(f"Redis at {self.where} is still unreachable",
                                     attempted=False)
                try:
                    c = await self.connect()
                except RedisUnavailable as e:
                    raise self.mark_down(str(e)) from None
            t = time.perf_counter()
            try:
                with trio.fail_after(CALL_TIMEOUT):
                    reply = await fn(c)
            except trio.TooSlowError:
                c.abort()
                err = self.mark_down(f"no reply from Redis at {self.where} within "
                                     f"{CALL_TIMEOUT:.0f} s")
                err.maybe_done = True          # the command may have run: its reply is lost
                raise err from None
            except RedisUnavailable as e:
                err = self.mark_down(str(e))
                err.maybe_done = True
                raise err from None
            except RedisError as e:
                self._up()
                raise _translate(e) from None
            finally:
                if c.closed:
                    c.abort()
                else:
                    self._idle.append(c)
            self.calls += 1
            self.call_seconds += time.perf_counter() - t
            self._up()
            return reply

    async def pipeline(self, commands: Sequence[Sequence[Any]], *, raise_errors: bool = True) -> list:
        return await self._run(lambda c: c.pipeline(commands, raise_errors=raise_errors))

    async def call(self, *args: Any) -> Any:
        return (await self.pipeline([args]))[0]

    async def eval(self, script: str, args: Sequence[Any]) -> Any:
        """Run one of kvfs's Lua scripts; KEYS[1] is the pool's key prefix."""
        return await self._run(lambda c: c.eval(script, [self.prefix], args))

    async def aclose(self) -> None:
        while self._idle:
            self._idle.pop().abort()


def _translate(e: RedisError) -> KvfsError:
    """A script's "<ERRNO> message" error reply -> KvfsError(errno); anything else is EIO."""
    text = str(e)
    code, _, message = text.partition(" ")
    if code in _ERRNOS:
        return KvfsError(_ERRNOS[code], message)
    log.error("cluster: Redis refused a command: %s", text)
    return KvfsError(errno.EIO, f"cluster catalog: Redis error: {text}")
