"""The kvfs configuration: TOML, typed and validated, with an embedded default.

Every key is listed in `mount/kvfs.example.toml`. Loading either returns a complete `Config` or
raises `ConfigError` with one line naming the key and the problem; nothing is created or
changed while loading. Relative paths are resolved against the directory of the config file.
"""

from __future__ import annotations

import os
import shutil
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from kvfs.errors import ConfigError
from kvfs.units import parse_size

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30

DEFAULT_DRAM_CAPACITY = 1 * GiB
DEFAULT_POOL_FILE_SIZE = 4 * GiB
DEFAULT_STRIPE_UNIT = 1 * MiB
DEFAULT_QUEUE_DEPTH = 8
DEFAULT_WRITEBACK_MS = 100
# A namespace that has not finished its share of a write within this (plus the share's bytes
# at 64 MB/s) is failed for new placement and the share written elsewhere: Linux's NVMe
# driver waits 30 s before it aborts a command, a stall no writer should wait out.
DEFAULT_IO_TIMEOUT_MS = 5000
# a cold read waits this long for the pool at most: a healthy namespace gives a 32 MiB chunk in
# tens of milliseconds, and for a cache a hit later than this is worth less than a recompute
DEFAULT_READ_TIMEOUT_MS = 2000
DEFAULT_ATTR_TIMEOUT = 30.0  # seconds the kernel keeps names and attributes (one node)


def default_state_dir() -> Path:
    if os.geteuid() == 0:
        return Path("/var/lib/kvfs")
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(base) / "kvfs"


def mem_total() -> int:
    """Bytes of memory the machine has."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def mem_available() -> int:
    """Bytes the kernel says are available for new allocations (MemAvailable)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


@dataclass(frozen=True)
class NamespaceConfig:
    path: Path
    size: int | None = None  # files only: created and preallocated at this size
    queue_depth: int = DEFAULT_QUEUE_DEPTH
    weight: float = 1.0  # share of each block placed here (relative to the others)


@dataclass(frozen=True)
class PoolConfig:
    namespaces: tuple[NamespaceConfig, ...]
    evict: str = "prefix"  # a full pool drops closed files: "prefix" by the prefix-aware
    # policy, "lru" least recently used first; "never": ENOSPC
    stripe_unit: int = DEFAULT_STRIPE_UNIT
    max_block_size: int | None = None  # default: the pool's capacity
    adaptive_placement: bool = True  # weight placement by each namespace's measured throughput
    io_engine: str = "auto"  # small blocks' I/O by Linux AIO on the trio thread ("auto"),
    # or by worker threads ("threads")
    io_workers: int = 2  # processes that read fetches into block memory (kvfs/pool/io_workers.py);
    # 0: on the daemon's own threads
    io_timeout_ms: int = DEFAULT_IO_TIMEOUT_MS  # a namespace's share of a write past this
    # (plus its bytes at 64 MB/s): failed, written elsewhere
    read_timeout_ms: int = DEFAULT_READ_TIMEOUT_MS  # a reader waits for the pool this long
    # at most (plus the block's bytes at 64 MB/s): then a miss, and the namespace failed for
    # reads; 0: no limit


@dataclass(frozen=True)
class DramConfig:
    capacity: int = DEFAULT_DRAM_CAPACITY
    policy: str = "prefix"
    huge_pages: bool = True  # block memory on a private tmpfs with transparent huge pages


@dataclass(frozen=True)
class LocalConfig:
    path: Path
    size: int | None = None  # files only: created and preallocated at this size
    queue_depth: int = DEFAULT_QUEUE_DEPTH
    policy: str = "prefix"
    admission: str = "second-access"


@dataclass(frozen=True)
class PrefetchConfig:
    enabled: bool = True
    max_window: int = 16  # blocks fetched ahead of a reader at most


@dataclass(frozen=True)
class MountConfig:
    allow_other: bool = False
    attr_timeout: float = 30.0  # (1.0 with [cluster])
    max_tasks: int = 512  # concurrent FUSE requests in flight
    passthrough: bool = True  # FUSE passthrough where the kernel offers it
    # When a file's bytes are durable (docs/architecture.md, "Durability and write-back"):
    # "fsync" (POSIX's, the default): fsync()/fdatasync() make a file durable, a closed file
    # is written back within `writeback_ms` (a shared pool publishes it then: docs/cluster.md);
    # "close": close() returns once the file is durable (and, shared, published)
    durability: str = "fsync"
    writeback_ms: int = DEFAULT_WRITEBACK_MS
    dirty_limit: int = 0  # bytes not yet written back before writers wait (0: auto)


@dataclass(frozen=True)
class EventsConfig:
    """KV events for routers (docs/configuration.md, "KV events"; kvfs/events/)."""

    enabled: bool = False
    endpoint: str = "tcp://*:5557"  # the PUB socket: bound (a wildcard, ipc://) or connected
    replay_endpoint: str | None = None  # the ROUTER socket serving missed batches
    topic: str = "kv@{node}@{model}"  # {node}: `node`; {model}: the block's model
    node: str | None = None  # default: [cluster] node_id, or the host name
    model: str = ""  # {model}: the name routers know (else each block's path's, "/" as "_")
    locality: str | None = None  # default: the node's name, or "pool:<name>" with [cluster]
    layout: str = "vllm"  # which files are blocks: a known layout...
    pattern: str | None = None  # ...or a naming rule of your own (kvfs/events/naming.py)
    buffer_steps: int = 10_000  # batches kept for replay
    hwm: int = 100_000  # batches queued per subscriber before it loses them


@dataclass(frozen=True)
class ClusterConfig:
    """A pool shared by several nodes, its catalog in Redis (see docs/cluster.md)."""

    redis: str  # redis://[user:password@]host:port/db or rediss:// (TLS)
    node_id: str  # this node's name in logs and statistics
    name: str = "kvfs"  # key prefix: one Redis can hold several pools
    password: str | None = None  # overrides the URL's password
    password_file: Path | None = None
    tls_ca: Path | None = None  # rediss://: CA bundle to verify the server with
    tls_cert: Path | None = None  # rediss://: client certificate (mutual TLS)
    tls_key: Path | None = None
    lease_seconds: float = 10.0  # a dead node's allocation leases expire after this
    grace_seconds: float = 30.0  # an evicted or replaced block's space is reused after this
    regions: int = 64  # the pool is leased in this many regions
    free_target: float = 0.05  # evict ahead to keep this share free (docs/cluster.md: sizing)
    # Sentinel (docs/cluster.md, "Surviving the loss of Redis"): the master is found through
    # these sentinels; `redis` then names no host, only the scheme, credentials and database.
    sentinels: tuple[tuple[str, int], ...] = ()
    master_name: str = "kvfs"  # the name the sentinels monitor the master under
    sentinel_password: str | None = None
    # A change kvfs reports durable (a publish at close, a lease, a mount's epoch) has reached
    # the replicas `confirm` names, and at least this many (Redis WAIT); 1 with sentinels, 0
    # without (0: no WAIT at all).
    min_replicas: int = 0
    replica_timeout_ms: int = 1000  # how long one WAIT waits for them
    no_replica: str = "fail"  # then: "fail" (EIO) or "wait" (retry until they answer)
    # (sentinels) which replicas must confirm: "all" Sentinel knows of, up or down (a replaced
    # master can acknowledge nothing the promoted replica lacks), or only those "up" (stores
    # resume right after a failover; a split brain can lose acknowledged changes)
    confirm: str = "all"
    # (sentinels) each shard's follower reads the change log and what it names from a replica
    # of that shard's master instead of the master (docs/cluster.md, "Followers on replicas"):
    # the reads of every node's follower, which grow with the square of the nodes, leave the
    # master. Needs confirm = "all" (every replica has each change before it is acknowledged).
    follow_replicas: bool = False
    # More Redis for one pool (docs/cluster.md, "More than one Redis"): the other shards, as
    # `redis` URLs (without sentinels) or master names (with them; the same sentinels watch
    # every shard's master). `redis`/`master_name` is shard 0, which also holds what the
    # pool has one of (the node epochs, the allocation leases, the eviction floor and locks).
    shards: tuple[str, ...] = ()

    @property
    def shard_count(self) -> int:
        return 1 + len(self.shards)

    def shard(self, k: int) -> "ClusterConfig":
        """Shard k's own settings: its Redis (URL or master name) and its key prefix (the
        pool's name, then "#k" past shard 0: each shard's keys in their own hash slot)."""
        if k == 0:
            return self
        if self.sentinels:
            return replace(self, master_name=self.shards[k - 1], name=f"{self.name}#{k}", shards=())
        return replace(self, redis=self.shards[k - 1], name=f"{self.name}#{k}", shards=())

    @property
    def where(self) -> str:
        """host:port of the Redis server (for messages; no password); with sentinels, the
        master's name and the sentinels."""
        if self.sentinels:
            return f"master {self.master_name!r} via sentinels " + ",".join(
                f"{h}:{p}" for h, p in self.sentinels
            )
        from urllib.parse import urlparse

        u = urlparse(self.redis)
        return f"{u.hostname}:{u.port or 6379}"


@dataclass(frozen=True)
class Config:
    state_dir: Path
    pool: PoolConfig
    dram: DramConfig = field(default_factory=DramConfig)
    mount: MountConfig = field(default_factory=MountConfig)
    prefetch: PrefetchConfig = field(default_factory=PrefetchConfig)
    local: LocalConfig | None = None
    cluster: ClusterConfig | None = None
    events: EventsConfig = field(default_factory=EventsConfig)
    log_level: str = "info"
    metrics_port: int = 0  # serve Prometheus metrics on this port (0: off)
    metrics_address: str = "127.0.0.1"
    source: Path | None = None  # the file this came from; None for the embedded default

    @property
    def catalog_path(self) -> Path:
        return self.state_dir / "catalog.sqlite"


# ---------------------------------------------------------------------------------------------
# Validation helpers: each takes (value, key) and returns the typed value or raises ConfigError.


def _size(value: Any, key: str) -> int:
    try:
        return parse_size(value)
    except ValueError as e:
        raise ConfigError(f"config: {key}: {e}") from None


def _positive_size(value: Any, key: str) -> int:
    n = _size(value, key)
    if n <= 0:
        raise ConfigError(f"config: {key}: must be greater than zero")
    return n


def _str(value: Any, key: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"config: {key}: expected a string, got {value!r}")
    return value


def _bool(value: Any, key: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"config: {key}: expected true or false, got {value!r}")
    return value


def _choice(*choices: str) -> Callable[[Any, str], str]:
    def check(value: Any, key: str) -> str:
        if value not in choices:
            want = " or ".join(repr(c) for c in choices)
            raise ConfigError(f"config: {key}: expected {want}, got {value!r}")
        return value

    return check


def _read_timeout(value: Any, key: str) -> int:
    """0 (no limit) or 50 ms to 10 minutes."""
    if value == 0 and not isinstance(value, bool):
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not 50 <= value <= 600_000:
        raise ConfigError(
            f"config: {key}: expected 0 (no limit) or milliseconds from 50 to 600000, got {value!r}"
        )
    return value


def _int_range(lo: int, hi: int) -> Callable[[Any, str], int]:
    def check(value: Any, key: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise ConfigError(
                f"config: {key}: expected an integer from {lo} to {hi}, got {value!r}"
            )
        return value

    return check


def _number_range(lo: float, hi: float) -> Callable[[Any, str], float]:
    def check(value: Any, key: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value <= hi:
            raise ConfigError(f"config: {key}: expected a number from {lo} to {hi}, got {value!r}")
        return float(value)

    return check


class _Table:
    """A TOML table being read: take() known keys, then done() rejects the rest."""

    def __init__(self, data: Any, where: str):
        if not isinstance(data, dict):
            raise ConfigError(f"config: {where}: expected a table, got {data!r}")
        self.data = dict(data)
        self.where = where

    def key(self, name: str) -> str:
        return f"{self.where}.{name}" if self.where else name

    def take(self, name: str, check: Callable[[Any, str], Any], default: Any = None) -> Any:
        if name not in self.data:
            return default
        return check(self.data.pop(name), self.key(name))

    def table(self, name: str) -> "_Table":
        return _Table(self.data.pop(name, {}), self.key(name))

    def done(self) -> None:
        if self.data:
            name = sorted(self.data)[0]
            raise ConfigError(f"config: unknown key {self.key(name)}")


def _passthrough_allowed() -> bool:
    """KVFS_PASSTHROUGH=off in the environment turns FUSE passthrough off whatever the config
    says (to run the test suite on the fallback data path)."""
    return os.environ.get("KVFS_PASSTHROUGH", "").strip().lower() not in ("0", "off", "no", "false")


def _removed_io(value: Any, key: str) -> None:
    raise ConfigError(
        f"config: {key}: removed (the io_uring engine depended on a wheel that "
        f"crashes on CPUs without AVX-512); see pool.io_engine"
    )


def _stripe_unit(value: Any, key: str) -> int:
    n = _size(value, key)
    if n < 4 * KiB or n > 64 * MiB or n & (n - 1):
        raise ConfigError(
            f"config: {key}: must be a power of two from 4KiB to 64MiB, got {value!r}"
        )
    return n


def _path(base: Path) -> Callable[[Any, str], Path]:
    def check(value: Any, key: str) -> Path:
        s = _str(value, key)
        if not s:
            raise ConfigError(f"config: {key}: must not be empty")
        p = Path(os.path.expanduser(s))
        return p if p.is_absolute() else (base / p).resolve()

    return check


def _namespaces(value: Any, key: str, base: Path) -> tuple[NamespaceConfig, ...]:
    if not isinstance(value, list) or not value:
        raise ConfigError(f"config: {key}: expected one or more [[pool.namespace]] tables")
    out = []
    for i, item in enumerate(value):
        t = _Table(item, f"{key}[{i}]")
        path = t.take("path", _path(base))
        if path is None:
            raise ConfigError(f"config: {key}[{i}].path: missing")
        size = t.take("size", _positive_size)
        if size is not None and size % (4 * KiB):
            raise ConfigError(f"config: {key}[{i}].size: must be a multiple of 4KiB")
        ns = NamespaceConfig(
            path=path,
            size=size,
            queue_depth=t.take("queue_depth", _int_range(1, 256), DEFAULT_QUEUE_DEPTH),
            weight=t.take("weight", _number_range(0.01, 100.0), 1.0),
        )
        t.done()
        out.append(ns)
    paths = [str(n.path) for n in out]
    for p in paths:
        if paths.count(p) > 1:
            raise ConfigError(f"config: {key}: namespace {p} is listed twice")
    return tuple(out)


def _redis_url(value: Any, key: str, *, host: bool = True) -> str:
    from urllib.parse import urlparse

    s = _str(value, key)
    try:
        u = urlparse(s)
        port = u.port
    except ValueError as e:
        raise ConfigError(f"config: {key}: not a valid URL: {e}") from None
    if not host and (u.hostname or port):
        raise ConfigError(
            f"config: {key}: with sentinels, name no host (Sentinel names the "
            f"master): redis://[user:password@]/db or rediss://..., got {s!r}"
        )
    if u.scheme not in ("redis", "rediss") or (host and not u.hostname):
        raise ConfigError(
            f"config: {key}: expected redis://host:port/db or rediss://..., got {s!r}"
        )
    db = (u.path or "/").strip("/")
    if db and not db.isdigit():
        raise ConfigError(f"config: {key}: the database must be a number, got {db!r}")
    del port
    return s


def _address(value: Any, key: str) -> tuple[str, int]:
    s = _str(value, key)
    host, _, port = s.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f'config: {key}: expected "host:port", got {s!r}')
    return host.strip("[]"), int(port)


def _addresses(value: Any, key: str) -> tuple[tuple[str, int], ...]:
    if not isinstance(value, list) or not value:
        raise ConfigError(f'config: {key}: expected a non-empty list of "host:port"')
    return tuple(_address(v, f"{key}[{i}]") for i, v in enumerate(value))


def _cluster(t: "_Table", base: Path) -> ClusterConfig:
    import socket

    sentinels = t.take("sentinels", _addresses, ())
    redis = t.take("redis", lambda v, k: _redis_url(v, k, host=not sentinels))
    if redis is None:
        if not sentinels:
            raise ConfigError(
                "config: cluster.redis: missing (redis://host:port/db), or give cluster.sentinels"
            )
        redis = "redis:///0"
    node_id = t.take("node_id", _str) or socket.gethostname()
    name = t.take("name", _str, "kvfs")
    if not name or any(c in name for c in "{}: \t\n"):
        raise ConfigError(
            f"config: cluster.name: must be non-empty without braces, colons or "
            f"spaces, got {name!r}"
        )
    c = ClusterConfig(
        redis=redis,
        node_id=node_id,
        name=name,
        password=t.take("password", _str),
        password_file=t.take("password_file", _path(base)),
        tls_ca=t.take("tls_ca", _path(base)),
        tls_cert=t.take("tls_cert", _path(base)),
        tls_key=t.take("tls_key", _path(base)),
        lease_seconds=t.take("lease_seconds", _number_range(1.0, 600.0), 10.0),
        grace_seconds=t.take("grace_seconds", _number_range(0.5, 3600.0), 30.0),
        regions=t.take("regions", _int_range(1, 4096), 64),
        free_target=t.take("free_target", _number_range(0.0, 0.5), 0.05),
        sentinels=sentinels,
        master_name=t.take("master_name", _str, "kvfs"),
        sentinel_password=t.take("sentinel_password", _str),
        min_replicas=t.take("min_replicas", _int_range(0, 16), 1 if sentinels else 0),
        replica_timeout_ms=t.take("replica_timeout_ms", _int_range(10, 60_000), 1000),
        no_replica=t.take("no_replica", _choice("fail", "wait"), "fail"),
        confirm=t.take("confirm", _choice("all", "up"), "all"),
        follow_replicas=t.take("follow_replicas", _bool, False),
        shards=tuple(
            t.take(
                "shards",
                lambda v, k: _shards(v, k, sentinels=bool(sentinels)),
                (),
            )
        ),
    )
    t.done()
    if c.follow_replicas and not (sentinels and c.confirm == "all" and c.min_replicas >= 1):
        raise ConfigError(
            'config: cluster.follow_replicas: needs cluster.sentinels, confirm = "all" and '
            "min_replicas >= 1 (a replica must hold every change before it is acknowledged)"
        )
    if not sentinels and c.sentinel_password is not None:
        raise ConfigError("config: cluster: sentinel_password needs cluster.sentinels")
    if c.password is not None and c.password_file is not None:
        raise ConfigError("config: cluster: give password or password_file, not both")
    if (c.tls_cert is None) != (c.tls_key is None):
        raise ConfigError("config: cluster: tls_cert and tls_key go together")
    if (c.tls_ca or c.tls_cert) and not redis.startswith("rediss://"):
        raise ConfigError("config: cluster: TLS options need a rediss:// URL")
    return c


def _shards(value: Any, key: str, *, sentinels: bool) -> tuple[str, ...]:
    """cluster.shards: the pool's other Redis shards: URLs, or master names with sentinels."""
    if not isinstance(value, list) or not value:
        raise ConfigError(f"config: {key}: expected a non-empty list, got {value!r}")
    if len(value) > 63:
        raise ConfigError(f"config: {key}: at most 63 more shards, got {len(value)}")
    out = []
    for i, v in enumerate(value):
        where = f"{key}[{i}]"
        out.append(_str(v, where) if sentinels else _redis_url(v, where))
    if len(set(out)) != len(out):
        raise ConfigError(f"config: {key}: a shard is named twice")
    return tuple(out)


def _endpoint(value: Any, key: str) -> str:
    """A ZMQ endpoint routers can reach. ZMQ itself takes a tcp port modulo 65536 (99999 binds
    34463) and "*" or 0 as "any free port", which no router could be told: a tcp endpoint
    must name its port, 1 to 65535."""
    v = _str(value, key)
    if not v.startswith(("tcp://", "ipc://", "inproc://")):
        raise ConfigError(f"config: {key}: {v!r} is not a ZMQ endpoint (tcp://, ipc://)")
    scheme, _, rest = v.partition("://")
    if scheme != "tcp":
        if not rest:
            raise ConfigError(f"config: {key}: {v!r}: expected {scheme}://<address>")
        return v
    host, _, port = rest.rpartition(";")[2].rpartition(":")  # (a source address precedes ";")
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ConfigError(
            f"config: {key}: {v!r}: expected tcp://host:port with a port from 1 to 65535"
        )
    return v


_TOPIC_FIELDS = ("node", "model")


def _topic(value: Any, key: str) -> str:
    """A topic template: literal text and the fields {node} and {model} (str.format's
    syntax), checked here so that a typo fails the config, not the daemon's first batch."""
    import string

    v = _str(value, key)
    allowed = ", ".join(f"{{{f}}}" for f in _TOPIC_FIELDS)
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(v) if f is not None]
    except ValueError as e:
        raise ConfigError(f"config: {key}: {v!r}: {e} (fields: {allowed})") from None
    for f in fields:
        if f not in _TOPIC_FIELDS:
            raise ConfigError(f"config: {key}: {v!r}: unknown field {{{f}}} (allowed: {allowed})")
    return v


def _events(t: "_Table") -> EventsConfig:
    from kvfs.events.naming import NamingRule

    d = EventsConfig()
    replay = t.take("replay_endpoint", _endpoint)
    ev = EventsConfig(
        enabled=t.take("enabled", _bool, False),
        endpoint=t.take("endpoint", _endpoint, d.endpoint),
        replay_endpoint=replay or None,
        topic=t.take("topic", _topic, d.topic),
        node=t.take("node", _str),
        model=t.take("model", _str, ""),
        locality=t.take("locality", _str),
        layout=t.take("layout", _choice("vllm"), "vllm"),
        pattern=t.take("pattern", _str),
        buffer_steps=t.take("buffer_steps", _int_range(1, 10_000_000), d.buffer_steps),
        hwm=t.take("hwm", _int_range(1, 10_000_000), d.hwm),
    )
    t.done()
    try:
        NamingRule.named(ev.layout, ev.pattern)
    except ValueError as e:
        raise ConfigError(f"config: events: {e}") from None
    return ev


def default_pool_file_size(state_dir: Path) -> int:
    """4 GiB, or half the free space where the state directory will live, whichever is less."""
    probe = state_dir
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        free = shutil.disk_usage(probe).free
    except OSError:
        return DEFAULT_POOL_FILE_SIZE
    return max(64 * MiB, min(DEFAULT_POOL_FILE_SIZE, (free // 2) // MiB * MiB))


def default_dram_capacity() -> int:
    """1 GiB, or half of the memory available now, whichever is less."""
    return max(64 * MiB, min(DEFAULT_DRAM_CAPACITY, (mem_available() // 2) // MiB * MiB))


def _dram(t: _Table) -> DramConfig:
    """[dram]: its capacity defaults to what the machine has free now, so it is read here."""
    capacity = t.take("capacity", _positive_size)
    dram = DramConfig(
        capacity=capacity if capacity is not None else default_dram_capacity(),
        policy=t.take("policy", _choice("prefix", "lru", "probation"), "prefix"),
        huge_pages=t.take("huge_pages", _bool, True),
    )
    t.done()
    return dram


def _local(t: _Table, base: Path) -> LocalConfig:
    """[local]: the optional node-local tier, whose path is required once the table is given."""
    path = t.take("path", _path(base))
    if path is None:
        raise ConfigError("config: local.path: missing")
    size = t.take("size", _positive_size)
    if size is not None and size % (4 * KiB):
        raise ConfigError("config: local.size: must be a multiple of 4KiB")
    local = LocalConfig(
        path=path,
        size=size,
        queue_depth=t.take("queue_depth", _int_range(1, 256), DEFAULT_QUEUE_DEPTH),
        policy=t.take("policy", _choice("prefix", "lru", "probation"), "prefix"),
        admission=t.take("admission", _choice("second-access", "always"), "second-access"),
    )
    t.done()
    return local


def _prefetch(t: _Table) -> PrefetchConfig:
    """[prefetch]: read-ahead of blocks, a table of its own."""
    prefetch = PrefetchConfig(
        enabled=t.take("enabled", _bool, True),
        max_window=t.take("max_window", _int_range(1, 256), 16),
    )
    t.done()
    return prefetch


def _mount(t: _Table, *, shared: bool, dram_capacity: int) -> MountConfig:
    """[mount]: its defaults depend on [cluster] (attr_timeout) and on [dram] (dirty_limit)."""
    durability = t.take("durability", _choice("fsync", "close"), "fsync")
    dirty_limit = t.take("dirty_limit", _positive_size)
    mount = MountConfig(
        allow_other=t.take("allow_other", _bool, False),
        # One node: every change to a name or its attributes is made through this mount
        # (the kernel updates its cache) or announced to the kernel (an eviction, a dropped
        # write-back): the kernel may keep them long. A shared pool: other nodes' changes
        # reach this kernel through the follower, so a short timeout bounds a missed one.
        attr_timeout=t.take(
            "attr_timeout", _number_range(0.0, 3600.0), 1.0 if shared else DEFAULT_ATTR_TIMEOUT
        ),
        max_tasks=t.take("max_tasks", _int_range(4, 4096), 512),
        passthrough=t.take("passthrough", _bool, True) and _passthrough_allowed(),
        durability=durability,
        writeback_ms=t.take("writeback_ms", _int_range(1, 60_000), DEFAULT_WRITEBACK_MS),
        dirty_limit=dirty_limit if dirty_limit is not None else max(16 * MiB, dram_capacity // 4),
    )
    t.done()
    return mount


def _pool(t: _Table, state_dir: Path, base: Path) -> tuple[PoolConfig, bool]:
    """[pool] and whether it lists its namespaces (a cluster needs them listed, not defaulted)."""
    ns_key = t.key("namespace")
    raw_ns = t.data.pop("namespace", None)
    if raw_ns is None:
        namespaces = (
            NamespaceConfig(
                path=state_dir / "pool" / "ns0.img", size=default_pool_file_size(state_dir)
            ),
        )
    else:
        namespaces = _namespaces(raw_ns, ns_key, base)
    max_block = t.take("max_block_size", _positive_size)
    t.take("io", _removed_io)
    pool = PoolConfig(
        namespaces=namespaces,
        evict=t.take("evict", _choice("lru", "prefix", "never"), "prefix"),
        stripe_unit=t.take("stripe_unit", _stripe_unit, DEFAULT_STRIPE_UNIT),
        max_block_size=max_block,
        adaptive_placement=t.take("adaptive_placement", _bool, True),
        io_engine=t.take("io_engine", _choice("auto", "threads"), "auto"),
        io_workers=t.take("io_workers", _int_range(0, 64), 2),
        io_timeout_ms=t.take("io_timeout_ms", _int_range(100, 600_000), DEFAULT_IO_TIMEOUT_MS),
        read_timeout_ms=t.take("read_timeout_ms", _read_timeout, DEFAULT_READ_TIMEOUT_MS),
    )
    t.done()
    return pool, raw_ns is not None


def _check_shared_namespaces(pool: PoolConfig, state_dir: Path, listed: bool) -> None:
    """A cluster's namespaces are shared by every node: listed, none inside the state_dir."""
    if not listed:
        raise ConfigError(
            "config: cluster: every node must mount the same namespaces; list "
            "them in [[pool.namespace]] (the embedded default pool is node-local)"
        )
    for n in pool.namespaces:
        if state_dir in n.path.parents:
            raise ConfigError(
                f"config: pool.namespace {n.path}: inside state_dir, which is "
                f"node-local; a cluster's namespaces are shared by every node"
            )


def from_dict(data: dict, base: Path | None = None, source: Path | None = None) -> Config:
    """Build a validated Config from parsed TOML (missing keys take the embedded defaults)."""
    base = base or Path.cwd()
    top = _Table(data, "")
    state_dir = top.take("state_dir", _path(base)) or default_state_dir()
    log_level = top.take("log_level", _choice("debug", "info", "warning", "error"), "info")
    metrics_port = top.take("metrics_port", _int_range(0, 65535), 0)
    metrics_address = top.take("metrics_address", _str, "127.0.0.1")
    dram = _dram(top.table("dram"))
    local = _local(top.table("local"), base) if "local" in top.data else None
    prefetch = _prefetch(top.table("prefetch"))
    mount = _mount(top.table("mount"), shared="cluster" in top.data, dram_capacity=dram.capacity)
    pool, listed = _pool(top.table("pool"), state_dir, base)
    cluster = None
    if "cluster" in top.data:
        cluster = _cluster(top.table("cluster"), base)
        _check_shared_namespaces(pool, state_dir, listed)
    events = _events(top.table("events"))
    top.done()
    if local is not None and any(local.path == n.path for n in pool.namespaces):
        raise ConfigError(f"config: local.path: {local.path} is also a pool namespace")
    return Config(
        state_dir=state_dir,
        pool=pool,
        dram=dram,
        mount=mount,
        prefetch=prefetch,
        local=local,
        cluster=cluster,
        events=events,
        log_level=log_level,
        metrics_port=metrics_port,
        metrics_address=metrics_address,
        source=source,
    )


def load(path: str | os.PathLike | None) -> Config:
    """Load and validate a config file, or return the embedded default when *path* is None."""
    if path is None:
        return from_dict({})
    p = Path(path)
    try:
        text = p.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config: file not found: {p}") from None
    except OSError as e:
        raise ConfigError(f"config: cannot read {p}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config: {p}: not UTF-8 text") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config: {p}: not valid TOML: {e}") from None
    return from_dict(data, base=p.resolve().parent, source=p.resolve())
