"""The connection of one node to its cluster's Redis: a few connections, reconnects, and one
place that turns "Redis is unreachable" into EIO with a clear log line.

With `sentinels`, every new connection asks Sentinel which server is the master (the first
sentinel that answers) and checks with ROLE that it is one; a failover therefore reaches the
node as broken connections (a killed master) or READONLY replies (a demoted one), after which
its next connections go to the new master. A change kvfs reports durable (`eval`, `call_durable`)
is followed by a WAIT in the same round trip, for every replica Sentinel knows of (`confirm =
"all"`, the default; "up": those it counts as up), and at least `min_replicas`: a master
Sentinel has already replaced, but that still runs and still has a replica, must not
acknowledge a change (the replica it promoted stopped confirming at once, and it is among
them). With "up", a replica the node has not yet counted (one that just came back) can stand in
for the promoted one: bench/torture.py --failover lost acknowledged changes that way.
The follower asks Sentinel again every CHECK_SECONDS (`check_master`), which bounds how long a
node talks to a replaced master. What happens when the replicas do not answer in
`replica_timeout_ms` is `no_replica` (docs/cluster.md, "Surviving the loss of Redis").

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
from kvfs.errors import KvfsError, StartupError, Unsure
from kvfs.redis.resp import RedisClient, RedisError, RedisUnavailable, reason

log = logging.getLogger("kvfs.redis.link")

CONNECTIONS = 4  # calls in flight to Redis at once (each connection is sequential)
RECONNECT_SECONDS = 0.5  # between attempts while Redis is unreachable
CALL_TIMEOUT = 5.0  # a call that takes longer is treated as Redis being unreachable
SENTINEL_TIMEOUT = 1.0  # one sentinel's answer (the next one is asked after this)
WARN_EVERY = 5.0  # seconds between two log lines about the same replica trouble
CHECK_SECONDS = 1.0  # how often the follower asks Sentinel for the master and its replicas

# Error replies our scripts raise: "<ERRNO> message" -> the errno the caller gets.
_ERRNOS = {
    name: getattr(errno, name)
    for name in (
        "ENOENT",
        "EEXIST",
        "ENOTEMPTY",
        "EISDIR",
        "ENOTDIR",
        "EINVAL",
        "ESTALE",
        "EIO",
        "EXDEV",
    )
}


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
        self.quiet = False  # start-up: failures become one StartupError, not logs
        self.down_since: float | None = None
        self._next_attempt = 0.0
        self.calls = 0
        self.call_seconds = 0.0
        self.failures = 0
        self.epoch = 0  # this mount's epoch and lease token (bootstrap.join)
        self.token = ""
        self.master: tuple[str, int] | None = None  # with sentinels: the master now
        self.replicas_up = 0  # its replicas Sentinel counts as up (not s_down)
        self.replicas_known = 0  # all the replicas Sentinel knows of
        self.replica_addrs: list[tuple[str, int]] = []  # those up and linked to the master
        self._checked = -CHECK_SECONDS
        self.failovers = 0  # times Sentinel named another master than before
        self.unreplicated = 0  # changes made on the master that no replica confirmed
        self.replica_waits = 0  # WAITs repeated for them (no_replica = "wait")
        self.refused = 0  # writes a replica (READONLY) or the master refused
        self._first_sentinel = 0
        self._warned: dict[str, float] = {}

    @property
    def where(self) -> str:
        if self.cfg.sentinels and self.master is not None:
            return f"{self.master[0]}:{self.master[1]} (master {self.cfg.master_name!r})"
        return self.cfg.where

    def warn(self, kind: str, msg: str, *args: Any) -> None:
        """Log `msg` at most once per WARN_EVERY seconds per `kind` (a failover makes every
        write fail the same way)."""
        now = trio.current_time()
        if not self.quiet and now - self._warned.get(kind, -WARN_EVERY) >= WARN_EVERY:
            self._warned[kind] = now
            log.warning(msg, *args)

    def key(self, *parts: Any) -> str:
        return self.prefix + ":".join(str(p) for p in parts)

    async def connect(self) -> RedisClient:
        """A new dedicated connection to the master (the event follower uses one);
        RedisUnavailable if down, or if Sentinel names a server that is not (yet) a master."""
        if not self.cfg.sentinels:
            return await RedisClient.connect(
                self.cfg.redis, tls=self.tls, password=self.password, timeout=CALL_TIMEOUT
            )
        host, port = addr = await self.ask_sentinels()
        c, role = await self._open(addr)
        if not role or role[0] != b"master":
            c.abort()
            raise RedisUnavailable(
                f"Redis at {host}:{port}, which Sentinel names master "
                f"{self.cfg.master_name!r}, is a "
                f"{(role or [b'?'])[0].decode()} (a failover under way?)"
            )
        self._follow_master(addr)
        return c

    async def connect_replica(self, pick: int) -> tuple[RedisClient, tuple[str, int]] | None:
        """(follow_replicas) A new connection to one of the master's replicas that Sentinel
        last counted as up and linked, `pick` choosing which (so the nodes' followers spread
        over them), with its address, if that replica says it is one and is connected to its
        master now (`replica_in_sync`); else None."""
        if not self.replica_addrs:
            return None
        addr = self.replica_addrs[pick % len(self.replica_addrs)]
        try:
            c, role = await self._open(addr)
        except RedisUnavailable as e:
            self.warn("replica", "cluster: replica %s:%d unreachable: %s", *addr, e)
            return None
        if not replica_in_sync(role):
            c.abort()
            return None
        return c, addr

    async def _open(self, addr: tuple[str, int]) -> tuple[RedisClient, Any]:
        """(sentinels) A new connection to the server at `addr`, and its ROLE reply;
        RedisUnavailable if it cannot be reached or does not answer ROLE."""
        c = await RedisClient.connect(
            self.cfg.redis, tls=self.tls, password=self.password, timeout=CALL_TIMEOUT, address=addr
        )
        try:
            with trio.fail_after(CALL_TIMEOUT):
                return c, await c.call("ROLE")
        except (trio.TooSlowError, RedisError) as e:
            c.abort()
            raise RedisUnavailable(
                f"Redis at {addr[0]}:{addr[1]}: ROLE failed: {reason(e)}"
            ) from None
        except BaseException:
            c.abort()
            raise

    def _follow_master(self, addr: tuple[str, int]) -> bool:
        """Sentinel names `addr`: True (and the idle connections dropped) if that is a change."""
        moved = self.master is not None and addr != self.master
        if moved:
            self.failovers += 1
            log.warning(
                "cluster: master %r moved from %s:%d to %s:%d (Sentinel failover); following it",
                self.cfg.master_name,
                *self.master,
                *addr,
            )
            self._drop_idle()
        self.master = addr
        return moved

    @property
    def replica_target(self) -> int:
        """How many replicas must confirm a change kvfs relies on: every one Sentinel knows of
        (or counts as up, `confirm = "up"`), and at least min_replicas (0: none, as without
        Sentinel)."""
        n = self.cfg.min_replicas
        if not n or not self.cfg.sentinels:
            return n
        return max(n, self.replicas_up if self.cfg.confirm == "up" else self.replicas_known)

    async def check_master(self, now_please: bool = False) -> bool:
        """(The follower, at most every CHECK_SECONDS, or at once with `now_please`: its
        connection broke.) Ask Sentinel for the master and its replicas; True if the master
        moved (this node's connections to the old one are dropped; the caller reconnects).
        Sentinel unreachable: False, nothing changes."""
        now = trio.current_time()
        if not self.cfg.sentinels or (not now_please and now - self._checked < CHECK_SECONDS):
            return False
        self._checked = now
        try:
            addr = await self.ask_sentinels()
        except RedisUnavailable:
            return False
        return self._follow_master(addr)

    async def ask_sentinels(self) -> tuple[str, int]:
        """The master's address, from the first sentinel that names it (starting with the one
        that answered last); how many replicas of it that sentinel knows of and counts as up
        go into `replicas_known` and `replicas_up`. RedisUnavailable if none names it."""
        why = []
        scheme = "rediss" if self.tls is not None else "redis"
        n = len(self.cfg.sentinels)
        for k in range(n):
            i = (self._first_sentinel + k) % n
            host, port = self.cfg.sentinels[i]
            try:
                c = await RedisClient.connect(
                    f"{scheme}://",
                    tls=self.tls,
                    password=self.cfg.sentinel_password,
                    timeout=SENTINEL_TIMEOUT,
                    address=(host, port),
                )
            except RedisUnavailable as e:
                why.append(str(e))
                continue
            try:
                with trio.fail_after(SENTINEL_TIMEOUT):
                    got, replicas = await c.pipeline(
                        [
                            ("SENTINEL", "get-master-addr-by-name", self.cfg.master_name),
                            ("SENTINEL", "replicas", self.cfg.master_name),
                        ]
                    )
            except (RedisUnavailable, RedisError, trio.TooSlowError) as e:
                why.append(f"sentinel {host}:{port}: {reason(e)}")
                continue
            finally:
                c.abort()
            if not got:
                why.append(f"sentinel {host}:{port} monitors no master {self.cfg.master_name!r}")
                continue
            self._first_sentinel = i
            self.replicas_up = sum(1 for r in replicas if not _replica_down(r))
            self.replicas_known = len(replicas)
            # (sorted: each sentinel lists them in its own order, and the nodes spread over
            # them by position, `connect_replica`)
            self.replica_addrs = sorted(a for a in map(_replica_linked, replicas) if a is not None)
            return got[0].decode(), int(got[1])
        raise RedisUnavailable("no sentinel named the master: " + "; ".join(why))

    def _drop_idle(self) -> None:
        """Close the idle connections (they lead to a server that is no longer the master)."""
        while self._idle:
            self._idle.pop().abort()

    # --- state transitions ---------------------------------------------------------------------
    def mark_down(self, why: str, *, attempted: bool = True, maybe_done: bool = False) -> KvfsError:
        """Redis failed us (`why`: a reason that names Redis); the error to raise (`Unsure`,
        marked `maybe_done`, where a command was sent and its reply lost)."""
        if attempted:
            self.failures += 1
            self._next_attempt = trio.current_time() + RECONNECT_SECONDS
        if self.online:
            self.online = False
            self.down_since = trio.current_time()
            if not self.quiet:
                log.error(
                    "cluster: Redis at %s is unreachable (%s): lookups of names this node "
                    "does not know and all changes fail with EIO until it is back; open and "
                    "DRAM-resident blocks keep being served",
                    self.where,
                    why,
                )
        msg = f"cluster catalog unavailable: {why}"
        return Unsure(msg, maybe_done=True) if maybe_done else KvfsError(errno.EIO, msg)

    def reached(self) -> None:
        """Redis answered on a connection of this link's own (the follower's): it is up (a
        shard whose only traffic is its follower would otherwise stay marked down until its
        next change)."""
        self._up()

    def _up(self) -> None:
        if not self.online and not self.quiet:
            log.warning(
                "cluster: Redis at %s is reachable again after %.1f s",
                self.where,
                trio.current_time() - (self.down_since or trio.current_time()),
            )
        self.online = True
        self.down_since = None

    # --- connections ---------------------------------------------------------------------------
    async def _run(self, fn, replicas: int = 0) -> Any:
        """Run fn(connection) on an idle connection (opening one if needed); translate errors.
        With `replicas`, fn returns (reply, replicas that acknowledged it) and the reply is
        returned once enough did (`_replicated`)."""
        async with self._slots:
            if self._idle:
                c = self._idle.pop()
            else:
                if not self.online and trio.current_time() < self._next_attempt:
                    raise self.mark_down(
                        f"Redis at {self.where} is still unreachable", attempted=False
                    )
                try:
                    c = await self.connect()
                except RedisUnavailable as e:
                    raise self.mark_down(str(e)) from None
            t = time.perf_counter()
            try:
                with trio.fail_after(CALL_TIMEOUT):
                    reply = await fn(c)
                if replicas:
                    reply = await self._replicated(c, *reply, replicas)
            except trio.TooSlowError:
                c.abort()
                raise self.mark_down(  # the command may have run: its reply is lost
                    f"no reply from Redis at {self.where} within {CALL_TIMEOUT:.0f} s",
                    maybe_done=True,
                ) from None
            except RedisUnavailable as e:
                raise self.mark_down(str(e), maybe_done=True) from None
            except RedisError as e:
                self._up()
                text = str(e)
                if text.startswith(("READONLY", "NOREPLICAS")):
                    # it did not run: a demoted master (its clients must find the new one)
                    # or a master with too few replicas in sync (min-replicas-to-write)
                    self.refused += 1
                    if text.startswith("READONLY"):
                        c.abort()
                        self._drop_idle()
                    self.warn(
                        text[:10], "cluster: Redis at %s refused a change: %s", self.where, text
                    )
                    raise KvfsError(
                        errno.EIO,
                        f"cluster catalog: Redis at {self.where} refused the change: {text}",
                    ) from None
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

    async def _replicated(self, c: RedisClient, reply: Any, acked: int, n: int) -> Any:
        """The change `reply` answers is on the master and on `acked` replicas; return it once
        `n` have it. Fewer within replica_timeout_ms: `no_replica = "fail"` raises EIO marked
        `unreplicated` (the change is on the master: a failover may drop it, or not);
        "wait" asks again until they answer, or until Sentinel names another master, which
        decides the change's fate (EIO marked `maybe_done`: the caller asks it)."""
        ms = self.cfg.replica_timeout_ms
        while acked < n:
            if self.cfg.no_replica == "fail":
                self.unreplicated += 1
                self.warn(
                    "replicas",
                    "cluster: a change reached %d of %d replicas of Redis at "
                    '%s within %d ms: failing it (cluster.no_replica = "fail")',
                    acked,
                    n,
                    self.where,
                    ms,
                )
                raise Unsure(
                    f"cluster catalog: the change reached {acked} of {n} "
                    f"replicas of Redis at {self.where} within {ms} ms",
                    unreplicated=True,
                )
            self.replica_waits += 1
            self.warn(
                "replicas",
                "cluster: a change reached %d of %d replicas of Redis at %s "
                'within %d ms: waiting (cluster.no_replica = "wait")',
                acked,
                n,
                self.where,
                ms,
            )
            if self.cfg.sentinels:
                try:
                    moved = await self.ask_sentinels() != self.master
                except RedisUnavailable:
                    moved = False
                if moved:
                    c.abort()
                    raise RedisUnavailable(
                        "Sentinel named another master while a change waited for its replicas"
                    )
            with trio.fail_after(ms / 1000 + CALL_TIMEOUT):
                acked = await c.call("WAIT", n, ms)
        return reply

    async def pipeline(
        self, commands: Sequence[Sequence[Any]], *, raise_errors: bool = True
    ) -> list:
        return await self._run(lambda c: c.pipeline(commands, raise_errors=raise_errors))

    async def call(self, *args: Any) -> Any:
        return (await self.pipeline([args]))[0]

    async def call_durable(self, *args: Any) -> Any:
        """A command whose effect kvfs relies on (a mount's epoch): its reply once it reached
        `replica_target` replicas (see `_replicated`)."""
        n = self.replica_target
        if not n:
            return await self.call(*args)

        async def run(c: RedisClient):
            reply, acked = await c.pipeline([args, ("WAIT", n, self.cfg.replica_timeout_ms)])
            return reply, acked

        return await self._run(run, replicas=n)

    async def eval(self, script: str, args: Sequence[Any], *, durable: bool = True) -> Any:
        """Run one of kvfs's Lua scripts; KEYS[1] is the pool's key prefix. `durable`: kvfs
        relies on its change (a publish, a lease, a purge), so it must reach `replica_target`;
        False for hints whose loss in a failover costs only accuracy (access times, chains)."""
        n = self.replica_target if durable else 0
        if not n:
            return await self._run(lambda c: c.eval(script, [self.prefix], args))
        return await self._run(
            lambda c: c.eval(script, [self.prefix], args, wait=(n, self.cfg.replica_timeout_ms)),
            replicas=n,
        )

    def started(self) -> None:
        """Start-up is over: failures are logged from now on (until then they raise and
        become one StartupError; kvfs/catalog/redis/bootstrap.py makes the link quiet)."""
        self.quiet = False

    async def aclose(self) -> None:
        while self._idle:
            self._idle.pop().abort()


def _replica_down(flat: list) -> bool:
    """One entry of SENTINEL REPLICAS: whether Sentinel holds that replica down."""
    info = dict(zip(flat[::2], flat[1::2]))
    flags = info.get(b"flags", b"").split(b",")
    return any(f in flags for f in (b"s_down", b"o_down", b"disconnected"))


def _replica_linked(flat: list) -> tuple[str, int] | None:
    """One entry of SENTINEL REPLICAS: the replica's address if Sentinel holds it up and its
    link to the master up (`master-link-status` ok), else None."""
    info = dict(zip(flat[::2], flat[1::2]))
    if _replica_down(flat) or info.get(b"master-link-status") != b"ok":
        return None
    return info[b"ip"].decode(), int(info[b"port"])


def replica_in_sync(role: Any) -> bool:
    """A ROLE reply: a replica whose link to its master is up ("connected"; not still
    connecting or loading the master's data, when it would serve an older copy)."""
    return bool(role) and role[0] == b"slave" and len(role) > 3 and role[3] == b"connected"


def _translate(e: RedisError) -> KvfsError:
    """A script's "<ERRNO> message" error reply -> KvfsError(errno); anything else is EIO."""
    return reply_error(str(e))


def reply_error(text: str) -> KvfsError:
    """A script's "<ERRNO> message" (an error reply, or a file a batch refused) ->
    KvfsError(errno); anything else is EIO."""
    code, _, message = text.partition(" ")
    if code in _ERRNOS:
        return KvfsError(_ERRNOS[code], message)
    log.error("cluster: Redis refused a command: %s", text)
    return KvfsError(errno.EIO, f"cluster catalog: Redis error: {text}")
