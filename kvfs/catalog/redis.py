"""The cluster catalog: one pool shared by many nodes, its catalog in Redis.

Every node mounts the same namespaces. Redis holds the truth: the tree (`n:<ino>` hashes and
`d:<ino>` name indexes), the blocks (`b:<id>`), the chains (`l:<ino>`), the cluster-wide LRU
order (`atime`), retired blocks waiting out their grace period (`grave`), the allocation
leases (`lease:<region>`) and a log of changes (the stream `log`). Each node serves from a
mirror of the tree in memory (`TreeCatalog`), so lookups and getattr cost no round trip.

Changes are Redis-first: a mutation runs one Lua script that checks it against Redis (a name
another node took, a directory another node filled, a lease this node lost) and applies it
atomically, together with an entry in the log naming what changed; only then does this node
apply it to its mirror. Every node follows the log (XREAD) and refreshes what the entries name
from Redis; refreshing is idempotent (it reads current state), so a node that was away or fell
behind the trimmed log reloads a snapshot and replays the log from before it.

Space (see kvfs/pool.py `Regions`): a node allocates only inside regions it holds a lease on
(`SET NX PX`, renewed), publishes a block only if it still holds the leases of every region
the block lies in (checked by the publishing script), and stops writing into a region whose
lease may have run out. A block replaced or removed goes to the grave for `grace_seconds`
before its space is free again (`purge`); a node whose readers still hold it pushes that
deadline back (`hold_graves`), so its space is not reused while any node reads it; reads
verify checksums regardless.

docs/cluster.md describes the protocol and what each failure leaves behind.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
import time
import uuid
from typing import Any, Callable

import trio

from kvfs.catalog.base import ROOT_INO, BlobRec, Node
from kvfs.catalog.tree import RENAME_EXCHANGE, TreeCatalog, _now
from kvfs.cluster import ClusterLink
from kvfs.config import ClusterConfig
from kvfs.errors import KvfsError, StartupError
from kvfs.layout import Layout
from kvfs.redis_client import RedisClient, RedisUnavailable

log = logging.getLogger("kvfs.catalog")

SCHEMA_VERSION = "1"
EPOCH_SHIFT = 32          # inode, cookie and block ids: (node epoch << 32) | counter
LOG_MAXLEN = 100_000      # entries kept in the change log (a node further behind resyncs)
SCAN_BATCH = 500
LEASE_MARGIN = 0.8        # a lease is trusted for this share of its time-to-live

# --- Lua -----------------------------------------------------------------------------------------
_LIB = r"""
local P = KEYS[1]
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function err(code, msg) return redis.error_reply(code .. ' ' .. msg) end
local function is_dir(ino) return redis.call('HEXISTS', P .. 'n:' .. ino, 'd') == 1 end
local function leases_ok(token, regions)
  for r in string.gmatch(regions, '%S+') do
    if redis.call('GET', P .. 'lease:' .. r) ~= token then return false end
  end
  return true
end
local function bury(bid, grace, retired)
  if bid and bid ~= '' then
    redis.call('ZADD', P .. 'grave', now_ms() + tonumber(grace), bid)
    table.insert(retired, bid)
  end
end
local function drop_node(ino, grace, retired)
  local k = P .. 'n:' .. ino
  bury(redis.call('HGET', k, 'b'), grace, retired)
  redis.call('DEL', k, P .. 'd:' .. ino, P .. 'l:' .. ino)
  redis.call('ZREM', P .. 'atime', ino)
end
local function event(origin, inos, retired, key, value)
  local a = {P .. 'log', 'MAXLEN', '~', '""" + str(LOG_MAXLEN) + r"""', '*', 'o', origin}
  if #inos > 0 then table.insert(a, 'i'); table.insert(a, table.concat(inos, ' ')) end
  if #retired > 0 then table.insert(a, 'r'); table.insert(a, table.concat(retired, ' ')) end
  if key then table.insert(a, key); table.insert(a, value) end
  return redis.call('XADD', unpack(a))
end
local function tail()
  local last = redis.call('XREVRANGE', P .. 'log', '+', '-', 'COUNT', 1)
  if last[1] then return last[1][1] end
  return '0-0'
end
"""

# ARGV: origin ino parent name policy token regions grace ptime bid nblob [blob k v]* [node k v]*
_MKNODE = _LIB + r"""
local origin, ino, parent, name, policy = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local token, regions, grace, ptime, bid = ARGV[6], ARGV[7], ARGV[8], ARGV[9], ARGV[10]
local nb = tonumber(ARGV[11])
if not is_dir(parent) then return err('ENOENT', 'the directory was removed (by another node?)') end
local retired, inos = {}, {ino, parent}
local cur = redis.call('HGET', P .. 'd:' .. parent, name)
if cur then
  if policy == 'excl' then return err('EEXIST', 'already exists (made by another node?)') end
  if is_dir(cur) then return err('EISDIR', 'another node made a directory of that name') end
  drop_node(cur, grace, retired)
  table.insert(inos, cur)
end
if bid ~= '' then
  if not leases_ok(token, regions) then
    return err('ESTALE', 'this node lost its allocation lease on the space it wrote; not publishing')
  end
  local bf = {}
  for i = 12, 11 + 2 * nb do table.insert(bf, ARGV[i]) end
  redis.call('HSET', P .. 'b:' .. bid, unpack(bf))
  redis.call('ZADD', P .. 'atime', now_ms(), ino)
end
local nf = {}
for i = 12 + 2 * nb, #ARGV do table.insert(nf, ARGV[i]) end
redis.call('HSET', P .. 'n:' .. ino, unpack(nf))
redis.call('HSET', P .. 'd:' .. parent, name, ino)
redis.call('HSET', P .. 'n:' .. parent, 't', ptime, 'k', ptime)
event(origin, inos, retired)
return retired
"""

# ARGV: origin ino token regions grace bid nblob [blob k v]* [node k v]*
_COMMIT = _LIB + r"""
local origin, ino, token, regions, grace, bid = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local nb = tonumber(ARGV[7])
local k = P .. 'n:' .. ino
if redis.call('EXISTS', k) == 0 then return err('ENOENT', 'the file was removed by another node') end
if not leases_ok(token, regions) then
  return err('ESTALE', 'this node lost its allocation lease on the space it wrote; not publishing')
end
local retired = {}
bury(redis.call('HGET', k, 'b'), grace, retired)
local bf = {}
for i = 8, 7 + 2 * nb do table.insert(bf, ARGV[i]) end
redis.call('HSET', P .. 'b:' .. bid, unpack(bf))
local nf = {'b', bid}
for i = 8 + 2 * nb, #ARGV do table.insert(nf, ARGV[i]) end
redis.call('HSET', k, unpack(nf))
redis.call('ZADD', P .. 'atime', now_ms(), ino)
event(origin, {ino}, retired)
return retired
"""

# ARGV: origin ino parent name want(file|dir) expect_blob grace ptime
_REMOVE = _LIB + r"""
local origin, ino, parent, name, want = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local expect, grace, ptime = ARGV[6], ARGV[7], ARGV[8]
if redis.call('HGET', P .. 'd:' .. parent, name) ~= ino then
  return err('ENOENT', 'renamed or removed by another node')
end
if want == 'dir' and redis.call('HLEN', P .. 'd:' .. ino) > 0 then
  return err('ENOTEMPTY', 'directory not empty (another node added to it)')
end
if expect ~= '' and redis.call('HGET', P .. 'n:' .. ino, 'b') ~= expect then
  return err('ESTALE', 'the file was rewritten by another node')
end
local retired = {}
redis.call('HDEL', P .. 'd:' .. parent, name)
drop_node(ino, grace, retired)
redis.call('HSET', P .. 'n:' .. parent, 't', ptime, 'k', ptime)
event(origin, {ino, parent}, retired)
return retired
"""

# ARGV: origin src pold nold pnew nnew flags grace cookie_src cookie_tgt now
_RENAME = _LIB + r"""
local origin, src, pold, nold, pnew, nnew = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local flags, grace, csrc, ctgt, now = tonumber(ARGV[7]), ARGV[8], ARGV[9], ARGV[10], ARGV[11]
if redis.call('HGET', P .. 'd:' .. pold, nold) ~= src then
  return err('ENOENT', 'renamed or removed by another node')
end
if not is_dir(pnew) then return err('ENOENT', 'the target directory was removed') end
if is_dir(src) then
  local x = pnew
  for _ = 1, 4096 do
    if x == src then return err('EINVAL', 'cannot move a directory into itself') end
    if x == '1' then break end
    x = redis.call('HGET', P .. 'n:' .. x, 'p')
    if not x then break end
  end
end
local tgt = redis.call('HGET', P .. 'd:' .. pnew, nnew)
local retired, inos = {}, {src, pold, pnew}
if tgt == src then return retired end
if flags == 2 then
  if not tgt then return err('ENOENT', 'the other name is gone') end
  redis.call('HSET', P .. 'd:' .. pold, nold, tgt)
  redis.call('HSET', P .. 'd:' .. pnew, nnew, src)
  redis.call('HSET', P .. 'n:' .. src, 'p', pnew, 'n', nnew, 'c', ctgt, 'k', now)
  redis.call('HSET', P .. 'n:' .. tgt, 'p', pold, 'n', nold, 'c', csrc, 'k', now)
  table.insert(inos, tgt)
else
  if tgt then
    if flags == 1 then return err('EEXIST', 'already exists (made by another node?)') end
    local sd, td = is_dir(src), is_dir(tgt)
    if sd and not td then return err('ENOTDIR', 'not a directory') end
    if td and not sd then return err('EISDIR', 'is a directory') end
    if td and redis.call('HLEN', P .. 'd:' .. tgt) > 0 then
      return err('ENOTEMPTY', 'directory not empty')
    end
    drop_node(tgt, grace, retired)
    table.insert(inos, tgt)
  end
  redis.call('HDEL', P .. 'd:' .. pold, nold)
  redis.call('HSET', P .. 'd:' .. pnew, nnew, src)
  redis.call('HSET', P .. 'n:' .. src, 'p', pnew, 'n', nnew, 'c', csrc, 'k', now)
end
redis.call('HSET', P .. 'n:' .. pold, 't', now, 'k', now)
redis.call('HSET', P .. 'n:' .. pnew, 't', now, 'k', now)
event(origin, inos, retired)
return retired
"""

# ARGV: origin ino nset [k v]* [field to delete]*
_UPDATE = _LIB + r"""
local origin, ino, nset = ARGV[1], ARGV[2], tonumber(ARGV[3])
local k = P .. 'n:' .. ino
if redis.call('EXISTS', k) == 0 then return err('ENOENT', 'removed by another node') end
if nset > 0 then
  local f = {}
  for i = 4, 3 + 2 * nset do table.insert(f, ARGV[i]) end
  redis.call('HSET', k, unpack(f))
end
for i = 4 + 2 * nset, #ARGV do redis.call('HDEL', k, ARGV[i]) end
event(origin, {ino}, {})
return 'OK'
"""

# ARGV: origin [pred succ source delta]*   (delta '-' removes the link)
_LINKS = _LIB + r"""
local preds, seen = {}, {}
for i = 2, #ARGV, 4 do
  local pred, succ, src, d = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2]), ARGV[i + 3]
  local k = P .. 'l:' .. pred
  if d == '-' then
    redis.call('HDEL', k, succ)
  elseif redis.call('EXISTS', P .. 'n:' .. pred) == 1 and redis.call('EXISTS', P .. 'n:' .. succ) == 1 then
    local v, nv = redis.call('HGET', k, succ), nil
    if v then
      local s, w = string.match(v, '^(%d+) (%S+)$')
      s, w = tonumber(s), tonumber(w)
      if src > s then nv = string.format('%d %.6g', src, tonumber(d))
      elseif src == s then nv = string.format('%d %.6g', s, w + tonumber(d)) end
    else
      nv = string.format('%d %.6g', src, tonumber(d))
    end
    if nv then redis.call('HSET', k, succ, nv) end
    if redis.call('HLEN', k) > 8 then
      local all = redis.call('HGETALL', k)
      local weakest, ws, ww = nil, nil, nil
      for j = 1, #all, 2 do
        local s, w = string.match(all[j + 1], '^(%d+) (%S+)$')
        s, w = tonumber(s), tonumber(w)
        if weakest == nil or s < ws or (s == ws and w < ww) then weakest, ws, ww = all[j], s, w end
      end
      redis.call('HDEL', k, weakest)
    end
  end
  if not seen[pred] then seen[pred] = true; table.insert(preds, pred) end
end
if #preds > 0 then event(ARGV[1], {}, {}, 'l', table.concat(preds, ' ')) end
return #preds
"""

# ARGV: [ino atime_ns atime_ms]*
_ATIMES = _LIB + r"""
local n = 0
for i = 1, #ARGV, 3 do
  if redis.call('EXISTS', P .. 'n:' .. ARGV[i]) == 1 then
    redis.call('HSET', P .. 'n:' .. ARGV[i], 'a', ARGV[i + 1])
    redis.call('ZADD', P .. 'atime', ARGV[i + 2], ARGV[i])
    n = n + 1
  end
end
return n
"""

# ARGV: origin limit
_PURGE = _LIB + r"""
local ids = redis.call('ZRANGEBYSCORE', P .. 'grave', '-inf', now_ms(), 'LIMIT', 0, tonumber(ARGV[2]))
for _, id in ipairs(ids) do
  redis.call('DEL', P .. 'b:' .. id)
  redis.call('ZREM', P .. 'grave', id)
end
if #ids > 0 then event(ARGV[1], {}, {}, 'g', table.concat(ids, ' ')) end
return ids
"""

# ARGV: grace_ms id*  -> how many graves were pushed back (a reader here still uses them)
_HOLD = _LIB + r"""
local until_ms = now_ms() + tonumber(ARGV[1])
local n = 0
for i = 2, #ARGV do
  local s = redis.call('ZSCORE', P .. 'grave', ARGV[i])
  if s and tonumber(s) < until_ms then
    redis.call('ZADD', P .. 'grave', until_ms, ARGV[i])
    n = n + 1
  end
end
return n
"""

# ARGV: token ttl_ms region*  -> {region or '', log tail}
_ACQUIRE = _LIB + r"""
for i = 3, #ARGV do
  if redis.call('SET', P .. 'lease:' .. ARGV[i], ARGV[1], 'NX', 'PX', ARGV[2]) then
    return {ARGV[i], tail()}
  end
end
return {'', tail()}
"""

# ARGV: token ttl_ms region*  -> regions still held
_RENEW = _LIB + r"""
local ok = {}
for i = 3, #ARGV do
  if redis.call('GET', P .. 'lease:' .. ARGV[i]) == ARGV[1] then
    redis.call('PEXPIRE', P .. 'lease:' .. ARGV[i], ARGV[2])
    table.insert(ok, ARGV[i])
  end
end
return ok
"""

# ARGV: token region*
_RELEASE = _LIB + r"""
local n = 0
for i = 2, #ARGV do
  if redis.call('GET', P .. 'lease:' .. ARGV[i]) == ARGV[1] then
    redis.call('DEL', P .. 'lease:' .. ARGV[i])
    n = n + 1
  end
end
return n
"""

# ARGV: pool_id schema [root k v]*  -> the pool id Redis holds
_INIT = _LIB + r"""
local cur = redis.call('HGET', P .. 'meta', 'pool_id')
if cur then return cur end
redis.call('HSET', P .. 'meta', 'pool_id', ARGV[1], 'schema', ARGV[2])
local f = {}
for i = 3, #ARGV do table.insert(f, ARGV[i]) end
redis.call('HSET', P .. 'n:1', unpack(f))
return ARGV[1]
"""


@contextlib.asynccontextmanager
async def _init_lock(link: ClusterLink):
    """Hold the cluster's creation lock (one node at a time formats or creates the catalog);
    yields the catalog's meta hash as it is under the lock (empty if there is none)."""
    me = uuid.uuid4().hex
    deadline = time.monotonic() + 120
    while not await link.call("SET", link.key("init"), me, "NX", "PX", 120_000):
        if time.monotonic() > deadline:
            raise StartupError("cluster: another node has been creating the pool for two "
                               "minutes; remove the key " + link.key("init") + " if it died")
        await trio.sleep(0.2)
    try:
        yield _pairs(await link.call("HGETALL", link.key("meta")))
    finally:
        with trio.CancelScope(shield=True):
            await link.eval(_LIB + "if redis.call('GET', KEYS[1] .. 'init') == ARGV[1] then "
                            "redis.call('DEL', KEYS[1] .. 'init') end return 1", [me])


async def _create_catalog(link: ClusterLink, pool_id: str) -> dict[bytes, bytes]:
    """An empty catalog of `pool_id`: its meta hash and the root directory."""
    now = _now()
    root = [b"p", ROOT_INO, b"n", b"", b"c", 0, b"m", stat.S_IFDIR | 0o755,
            b"u", os.geteuid(), b"g", os.getegid(), b"a", now, b"t", now, b"k", now, b"d", 1]
    got = await link.eval(_INIT, [pool_id, SCHEMA_VERSION, *root])
    log.info("cluster: created the catalog of pool %s in Redis at %s", got.decode(), link.where)
    return {b"pool_id": got, b"schema": SCHEMA_VERSION.encode()}


async def _scan(conn, pattern: str) -> list[bytes]:
    keys, cursor = [], b"0"
    while True:
        cursor, batch = await conn.call("SCAN", cursor, "MATCH", pattern, "COUNT", SCAN_BATCH)
        keys += batch
        if cursor == b"0":
            return keys


# --- encoding ------------------------------------------------------------------------------------
def _node_fields(node: Node) -> list:
    f: list = [b"p", node.parent, b"n", node.name, b"c", node.cookie, b"m", node.mode,
               b"u", node.uid, b"g", node.gid, b"a", node.atime_ns, b"t", node.mtime_ns,
               b"k", node.ctime_ns]
    if node.children is not None:
        f += [b"d", 1]
    if node.target is not None:
        f += [b"s", node.target]
    if node.blob is not None:
        f += [b"b", node.blob.id]
    for name, value in node.xattrs.items():
        f += [b"x:" + name, value]
    return f


def _blob_fields(rec: BlobRec, ino: int) -> list:
    ns, offs, sums = rec.layout.pack()
    return [b"z", rec.layout.size, b"u", rec.layout.unit, b"N", ns, b"O", offs, b"S", sums,
            b"c", rec.created_ns, b"i", ino]


def _pairs(flat: list | None) -> dict[bytes, bytes]:
    if not flat:
        return {}
    return dict(zip(flat[::2], flat[1::2]))


def _parse_blob(bid: int, h: dict[bytes, bytes]) -> BlobRec:
    return BlobRec(bid, Layout.unpack(int(h[b"z"]), int(h[b"u"]), h[b"N"], h[b"O"], h[b"S"]),
                   int(h[b"c"]))


def _new_node(ino: int, h: dict[bytes, bytes]) -> Node:
    node = Node(ino, int(h[b"p"]), h[b"n"], int(h[b"m"]), int(h[b"u"]), int(h[b"g"]),
                int(h[b"a"]), int(h[b"t"]), int(h[b"k"]), cookie=int(h[b"c"]),
                target=h.get(b"s"), persisted=True)
    node.xattrs = {k[2:]: v for k, v in h.items() if k.startswith(b"x:")}
    if b"d" in h:
        node.children = {}
    return node


def _stream_id(sid: bytes) -> tuple[int, int]:
    a, _, b = sid.partition(b"-")
    return int(a), int(b or 0)


def _ids(value: bytes | None) -> list[int]:
    return [int(x) for x in value.split()] if value else []


class RedisCatalog(TreeCatalog):
    """The catalog of a pool shared by several nodes (see the module docstring)."""

    shared = True

    def __init__(self, link: ClusterLink, cfg: ClusterConfig):
        super().__init__()
        self.redis = link
        self.cfg = cfg
        self.pool = None
        self.epoch = 0
        self.token = ""
        self.grace_ms = int(cfg.grace_seconds * 1000)
        self.lease_ms = int(cfg.lease_seconds * 1000)
        self.grave: dict[int, BlobRec] = {}      # retired blocks whose space is not free yet
        self.used: dict[int, BlobRec] = {}       # published blocks whose space is used here
        self.last_id = b"0-0"                    # the last log entry applied
        self.synced_at = time.monotonic()        # when the follower last heard from Redis
        self.catalog_lost = False                # Redis came back without this pool's catalog
        self._progress = trio.Event()
        self._link_delta: dict[tuple[int, int], list] = {}
        self._resync = False
        # Called as on_change(kind, node, old_blob, old_parent, old_name) after another node
        # changed something this node may cache: kind is "gone", "content", "new" or "moved".
        # Set by the layer above (Files); never calls back down.
        self.on_change: Callable[..., None] | None = None
        self.events = 0
        self.refreshes = 0
        self.resyncs = 0
        self.purged = 0
        self.leases_lost = 0

    # ------------------------------------------------------------------------------ opening
    @classmethod
    async def open(cls, cfg: ClusterConfig, pool_opener: Callable[[str | None], Any]):
        """Connect, bind to the pool (`pool_opener(pool_id or None)` opens or creates it; the
        first node formats the namespaces under a Redis lock), load the mirror. Returns
        (catalog, pool)."""
        link = ClusterLink(cfg)
        link.quiet = True
        try:
            meta = _pairs(await link.call("HGETALL", link.key("meta")))
        except KvfsError as e:
            raise StartupError(f"cluster.redis: {e}", errno.EHOSTUNREACH) from None
        cat = cls(link, cfg)
        pool = None
        try:
            if meta and meta.get(b"schema") != SCHEMA_VERSION.encode():
                raise StartupError(f"cluster: Redis holds kvfs catalog schema "
                                   f"{meta.get(b'schema')!r}; this kvfs uses {SCHEMA_VERSION}")
            if not meta:
                meta = await cat._first_node(pool_opener)
                pool = cat.pool
            if pool is None:
                pool = pool_opener(meta[b"pool_id"].decode())
            cat.pool_id = pool.pool_id
            cat.pool = pool
            cat.epoch = await link.call("INCR", link.key("epoch"))
            if cat.epoch >= 1 << 31:
                raise StartupError("cluster: node epochs exhausted (more than 2^31 mounts)")
            base = cat.epoch << EPOCH_SHIFT
            cat._next_ino = cat._next_cookie = cat._next_blob = base + 1
            cat.token = f"{cfg.node_id}/{cat.epoch}/{uuid.uuid4().hex[:8]}"
            pool.share(cfg.regions)
            await cat._load_snapshot(initial=True)
        except BaseException:
            pool = pool or cat.pool
            if pool is not None:
                pool.close()
            with trio.CancelScope(shield=True):
                await link.aclose()
            raise
        await link.aclose()        # this trio run ends; the daemon's run reconnects
        link.quiet = False
        return cat, pool

    async def _first_node(self, pool_opener) -> dict[bytes, bytes]:
        """No catalog in Redis yet: one node (under a lock) formats the pool and creates it."""
        link = self.redis
        async with _init_lock(link) as meta:
            if meta:
                return meta
            pool = pool_opener(None)
            self.pool = pool
            if not pool.created:
                raise StartupError(f"the namespaces hold pool {pool.pool_id}, but Redis has no "
                                   f"catalog for it under {link.prefix!r} (wrong cluster.name or "
                                   f"database, or Redis lost its data?); to start over, run "
                                   f"`kvfs format --force`")
            return await _create_catalog(link, pool.pool_id)

    @classmethod
    async def format(cls, cfg: ClusterConfig, format_pool: Callable[[], str], *,
                     force: bool) -> str:
        """`kvfs format` with a [cluster] config: write new superblocks (`format_pool()`) and
        create an empty catalog in Redis, discarding an old one only with `force`. Refuses
        while any node holds a lease (a mounted node is using the pool). Returns the pool id."""
        link = ClusterLink(cfg)
        link.quiet = True
        try:
            try:
                await link.call("PING")
            except KvfsError as e:
                raise StartupError(f"cluster.redis: {e}", errno.EHOSTUNREACH) from None
            async with _init_lock(link) as meta:
                if meta and not force:
                    raise StartupError(
                        f"Redis at {link.where} already holds the catalog of pool "
                        f"{meta.get(b'pool_id', b'?').decode()} under {link.prefix!r}; refusing "
                        f"to start a new pool over it (use --force to discard it)", errno.EEXIST)
                leases = await _scan(link, link.key("lease:*"))
                if leases:
                    holders = sorted({(await link.call("GET", k) or b"?").decode().split("/")[0]
                                      for k in leases[:64]})
                    raise StartupError(f"node(s) {', '.join(holders)} hold leases on the pool "
                                       f"(still mounted?): unmount every node first", errno.EBUSY)
                pool_id = format_pool()
                old = [k for k in await _scan(link, link.prefix + "*")
                       if k != link.key("init").encode()]
                for i in range(0, len(old), 512):
                    await link.call("UNLINK", *old[i:i + 512])
                await _create_catalog(link, pool_id)
                return pool_id
        finally:
            with trio.CancelScope(shield=True):
                await link.aclose()

    def close(self) -> None:
        pass

    async def _scan(self, conn, pattern: str) -> list[bytes]:
        return await _scan(conn, pattern)

    async def _hgetall(self, conn, keys: list[bytes]) -> list[dict[bytes, bytes]]:
        out = []
        for i in range(0, len(keys), SCAN_BATCH):
            replies = await conn.pipeline([("HGETALL", k) for k in keys[i:i + SCAN_BATCH]])
            out += [_pairs(r) for r in replies]
        return out

    async def _load_snapshot(self, initial: bool, conn=None) -> None:
        """Load the whole catalog: the log position first, then every key (not atomically);
        replaying the log from that position afterwards makes the mirror exact."""
        c = conn or self.redis
        last = await c.call("XREVRANGE", self.redis.key("log"), "+", "-", "COUNT", 1)
        tail = last[0][0] if last else b"0-0"
        plen = len(self.redis.prefix)
        nkeys = await self._scan(c, self.redis.key("n:*"))
        nhashes = await self._hgetall(c, nkeys)
        bkeys = await self._scan(c, self.redis.key("b:*"))
        bhashes = await self._hgetall(c, bkeys)
        grave_ids = {int(x) for x in await c.call("ZRANGE", self.redis.key("grave"), 0, -1)}
        lkeys = await self._scan(c, self.redis.key("l:*"))
        lhashes = await self._hgetall(c, lkeys)
        blobs = {}
        for k, h in zip(bkeys, bhashes):
            if h:
                bid = int(k[plen + 2:])
                blobs[bid] = _parse_blob(bid, h)
        states = {}
        for k, h in zip(nkeys, nhashes):
            if h:
                states[int(k[plen + 2:])] = h
        if ROOT_INO not in states:
            raise StartupError("cluster: the catalog in Redis has no root directory")
        links = {int(k[plen + 2:]): h for k, h in zip(lkeys, lhashes) if h}
        if initial:
            self._build(states, blobs, grave_ids, links)
        else:
            await self._reconcile(states, blobs, grave_ids, links)
        self.last_id = tail
        self.synced_at = time.monotonic()

    def _build(self, states, blobs, grave_ids, links) -> None:
        for ino, h in states.items():
            node = _new_node(ino, h)
            if b"b" in h:
                bid = int(h[b"b"])
                node.blob = blobs.get(bid)
                if node.blob is None:
                    raise StartupError(f"cluster: file {ino} refers to missing block {bid}")
            self.nodes[ino] = node
        for node in self.nodes.values():
            if node.ino == ROOT_INO:
                continue
            parent = self.nodes.get(node.parent)
            if parent is None or parent.children is None:
                log.error("cluster: node %d has no parent directory in Redis; ignoring it",
                          node.ino)
                continue
            parent.children[node.name] = node.ino
            if node.children is not None:
                parent.subdirs += 1
        self.grave = {b: blobs[b] for b in grave_ids if b in blobs}
        used = [n.blob for n in self.nodes.values() if n.blob is not None]
        used += list(self.grave.values())
        self.used = {r.id: r for r in used}
        try:
            self.pool.attach(r.layout for r in used)
        except StartupError as e:
            raise StartupError(f"cluster: {e}") from None
        for pred, h in links.items():
            self._set_links(pred, h)

    def _set_links(self, pred: int, h: dict[bytes, bytes]) -> None:
        for succ in list(self.successors.get(pred, {})):
            self.predecessors.get(succ, set()).discard(pred)
        out = {}
        for k, v in h.items():
            succ = int(k)
            if pred in self.nodes and succ in self.nodes:
                s, w = v.split()
                out[succ] = [int(s), float(w)]
                self.predecessors.setdefault(succ, set()).add(pred)
        for (p, succ), (src, delta) in self._link_delta.items():   # not yet flushed here
            if p == pred and succ in self.nodes:
                cur = out.get(succ)
                if cur is None or src > cur[0]:
                    out[succ] = [src, delta]
                elif src == cur[0]:
                    cur[1] += delta
                self.predecessors.setdefault(succ, set()).add(pred)
        if out:
            self.successors[pred] = out
        else:
            self.successors.pop(pred, None)

    # ------------------------------------------------------------------------------ the mirror
    def _unplace(self, node: Node) -> None:
        parent = self.nodes.get(node.parent)
        if parent is not None and parent.children is not None \
                and parent.children.get(node.name) == node.ino:
            del parent.children[node.name]
            if node.children is not None:
                parent.subdirs -= 1

    def _notify(self, kind: str, node: Node, old: BlobRec | None, parent: int, name: bytes) -> None:
        if self.on_change is not None:
            self.on_change(kind, node, old, parent, name)

    def _vanish(self, node: Node, leaving: list[BlobRec]) -> None:
        """The node is gone from Redis (another node removed it or replaced it)."""
        if not node.persisted or not node.linked:
            return
        parent, name = node.parent, node.name
        self._unplace(node)
        node.linked = False
        node.ctime_ns = _now()
        self._forget_links(node.ino)
        if node.children:
            for child in [self.nodes[i] for i in node.children.values()]:
                child.linked = False
                self._notify("gone", child, None, child.parent, child.name)
            node.children.clear()
        if node.blob is not None and node.blob.id in self.used:
            leaving.append(node.blob)
        self._notify("gone", node, node.blob, parent, name)

    async def _fetch(self, conn, inos: list[int]) -> dict[int, dict[bytes, bytes]]:
        replies = await conn.pipeline([("HGETALL", self.redis.key("n", i)) for i in inos])
        return {i: _pairs(r) for i, r in zip(inos, replies)}

    async def _refresh(self, inos, conn=None) -> None:
        """Make the mirror's view of these inodes what Redis holds now."""
        c = conn or self.redis
        todo = [i for i in dict.fromkeys(inos)]
        states: dict[int, dict] = {}
        for _ in range(64):                      # parents first, fetched as they are needed
            if not todo:
                break
            states.update(await self._fetch(c, todo))
            todo = [int(h[b"p"]) for h in states.values()
                    if h and int(h[b"p"]) not in states and int(h[b"p"]) not in self.nodes]
        need = {int(h[b"b"]) for h in states.values() if h and b"b" in h}
        need = [b for b in need if b not in self.used]
        blobs = {}
        if need:
            replies = await c.pipeline([("HGETALL", self.redis.key("b", b)) for b in need])
            for b, r in zip(need, replies):
                if r:
                    blobs[b] = _parse_blob(b, _pairs(r))
        leaving: list[BlobRec] = []
        self._apply(states, blobs, leaving)
        await self._settle(leaving, c)
        self.refreshes += 1

    def _known_blob(self, bid: int, blobs: dict[int, BlobRec]) -> BlobRec | None:
        return self.used.get(bid) or blobs.get(bid)

    def _use(self, rec: BlobRec) -> None:
        """Count a block another node published as using its space here."""
        if rec.id not in self.used:
            self.used[rec.id] = rec
            self.pool.claim(rec.layout)

    def _apply(self, states: dict[int, dict], blobs: dict[int, BlobRec],
               leaving: list[BlobRec]) -> None:
        """Install fetched states (an empty dict: the inode is gone) into the mirror."""
        moved: dict[int, tuple[int, bytes]] = {}
        for ino, h in states.items():           # 1: take the nodes out of their places
            node = self.nodes.get(ino)
            if node is None or not node.persisted or not node.linked:
                continue
            if not h:
                self._vanish(node, leaving)
            elif (int(h[b"p"]), h[b"n"]) != (node.parent, node.name):
                moved[ino] = (node.parent, node.name)
                self._unplace(node)
        placed = []
        pending = [ino for ino, h in states.items() if h]
        for _ in range(len(pending) + 1):       # 2: parents before children
            rest = []
            for ino in pending:
                h = states[ino]
                parent = self.nodes.get(int(h[b"p"]))
                if ino != ROOT_INO and (parent is None or parent.children is None):
                    rest.append(ino)
                    continue
                if self._install(ino, h, blobs, leaving, moved):
                    placed.append(ino)
            if not rest or len(rest) == len(pending):
                for ino in rest:
                    log.warning("cluster: inode %d has no parent directory in Redis; skipped", ino)
                break
            pending = rest

    def _install(self, ino: int, h: dict, blobs: dict[int, BlobRec], leaving: list[BlobRec],
                 moved: dict[int, tuple[int, bytes]]) -> bool:
        node = self.nodes.get(ino)
        new = node is None or not node.linked
        fresh = _new_node(ino, h)
        bid = int(h[b"b"]) if b"b" in h else None
        rec = None
        if bid is not None:
            rec = self._known_blob(bid, blobs)
            if rec is None:
                log.error("cluster: file %d refers to block %d, which Redis does not hold", ino, bid)
                self._resync = True
                return False
        if ino != ROOT_INO:
            parent = self.nodes[fresh.parent]
            occupant = parent.children.get(fresh.name)
            if occupant is not None and occupant != ino:
                other = self.nodes[occupant]
                if not other.persisted:
                    # This node is writing a file of that name and has not committed it: its
                    # commit will replace the other node's file (the last close wins). The
                    # other file's space is in use meanwhile.
                    if rec is not None:
                        self._use(rec)
                    if node is not None and node.linked and node.persisted:
                        self._vanish(node, leaving)
                    return False
                self._unplace(other)          # stale here; Redis will tell where it went
                self._resync = True
        if node is None:
            node = fresh
            self.nodes[ino] = node
        elif not node.linked:                  # a node this node had dropped came back (rare)
            node.linked = True
        else:
            node.parent, node.name, node.cookie = fresh.parent, fresh.name, fresh.cookie
            node.mode, node.uid, node.gid = fresh.mode, fresh.uid, fresh.gid
            node.atime_ns, node.mtime_ns, node.ctime_ns = fresh.atime_ns, fresh.mtime_ns, fresh.ctime_ns
            node.target, node.xattrs = fresh.target, fresh.xattrs
        if ino != ROOT_INO:
            parent = self.nodes[node.parent]
            if parent.children.get(node.name) != ino:
                parent.children[node.name] = ino
                if node.children is not None:
                    parent.subdirs += 1
        old = node.blob
        if (old.id if old else None) != bid:
            node.blob = rec
            if rec is not None:
                self._use(rec)
            if old is not None and old.id in self.used:
                leaving.append(old)
        if new:
            self._notify("new", node, None, node.parent, node.name)
        else:
            if ino in moved:
                self._notify("moved", node, None, *moved[ino])
            if old is not None and (rec is None or rec.id != old.id):
                self._notify("content", node, old, node.parent, node.name)
        return True

    async def _settle(self, leaving: list[BlobRec], conn=None, retired: set[int] | None = None) -> None:
        """Blocks that stopped being a file's content here: in the grave (space still used),
        or already purged (space free)."""
        leaving = [r for r in leaving if r.id in self.used and r.id not in self.grave]
        if not leaving:
            return
        unknown = [r for r in leaving if retired is None or r.id not in retired]
        scores = {}
        if unknown:
            c = conn or self.redis
            replies = await c.pipeline([("ZSCORE", self.redis.key("grave"), r.id) for r in unknown])
            scores = {r.id: s for r, s in zip(unknown, replies)}
        for r in leaving:
            if (retired is not None and r.id in retired) or scores.get(r.id) is not None:
                self.grave[r.id] = r
            else:
                self.used.pop(r.id, None)
                self.pool.unclaim(r.layout)

    async def _reconcile(self, states, blobs, grave_ids, links) -> None:
        """After a gap in the log: make the mirror equal to a full snapshot."""
        self.resyncs += 1
        leaving: list[BlobRec] = []
        gone = [n for n in self.nodes.values()
                if n.persisted and n.linked and n.ino not in states]
        for node in gone:
            self._vanish(node, leaving)
        self._apply(states, blobs, leaving)
        for bid in list(self.grave):
            if bid not in grave_ids:
                rec = self.grave.pop(bid)
                self.used.pop(bid, None)
                self.pool.unclaim(rec.layout)
        for bid in grave_ids:
            if bid in blobs:
                self._use(blobs[bid])
                self.grave[bid] = self.used[bid]
        await self._settle(leaving, retired=grave_ids)
        for pred in list(self.successors):
            if pred not in links:
                self._set_links(pred, {})
        for pred, h in links.items():
            self._set_links(pred, h)

    # ------------------------------------------------------------------------------ the follower
    async def _follow(self) -> None:
        """Apply other nodes' changes as the log reports them; reconnect and resync as needed."""
        self._conn: RedisClient | None = None
        try:
            await self._follow_loop()
        finally:
            if self._conn is not None:
                self._conn.abort()

    async def _follow_loop(self) -> None:
        conn = None
        key = self.redis.key("log")
        while True:
            self._conn = conn
            try:
                if conn is None:
                    conn = self._conn = await self.redis.connect()
                    await self._check_catalog(conn)
                    first = await conn.call("XRANGE", key, "-", "+", "COUNT", 1)
                    if self.last_id != b"0-0" and first and \
                            _stream_id(first[0][0]) > _stream_id(self.last_id):
                        older = await conn.call("XRANGE", key, "-", self.last_id, "COUNT", 1)
                        if not older:
                            log.warning("cluster: missed part of the change log (trimmed while "
                                        "away); reloading the catalog")
                            self._resync = True
                if self._resync:
                    self._resync = False
                    await self._load_snapshot(initial=False, conn=conn)
                reply = await conn.call("XREAD", "COUNT", 512, "BLOCK", 1000, "STREAMS", key,
                                        self.last_id)
                self.synced_at = time.monotonic()
                if reply:
                    await self._apply_entries(reply[0][1], conn)
                progress, self._progress = self._progress, trio.Event()
                progress.set()
            except RedisUnavailable as e:
                if conn is not None:
                    conn.abort()
                    conn = None
                self.redis._down(str(e))
                await trio.sleep(0.5)
            except KvfsError as e:
                log.error("cluster: following the change log failed: %s; reloading", e)
                if conn is not None:
                    conn.abort()
                    conn = None
                self._resync = True
                await trio.sleep(0.5)

    async def _check_catalog(self, conn) -> None:
        """After (re)connecting: is the catalog still in Redis? A Redis restarted without
        persistence comes back empty; say so once, loudly (this node keeps serving what its
        mirror holds; changes fail until an operator re-creates the pool)."""
        meta = _pairs(await conn.call("HGETALL", self.redis.key("meta")))
        lost = meta.get(b"pool_id", b"").decode() != self.pool_id
        if lost and not self.catalog_lost:
            log.error("cluster: Redis at %s no longer holds the catalog of pool %s (restarted "
                      "without persistence, or flushed?): serving only what this node already "
                      "knows; unmount every node and run `kvfs format --force` to start over",
                      self.redis.where, self.pool_id)
        self.catalog_lost = lost

    async def _apply_entries(self, entries: list, conn) -> None:
        inos: list[int] = []
        retired: set[int] = set()
        purged: list[int] = []
        preds: list[int] = []
        origin = str(self.epoch).encode()
        for sid, flat in entries:
            self.events += 1
            f = _pairs(flat)
            if f.get(b"o") != origin:
                inos += _ids(f.get(b"i"))
                retired.update(_ids(f.get(b"r")))
                purged += _ids(f.get(b"g"))
                preds += _ids(f.get(b"l"))
            self.last_id = sid
        if inos:
            await self._refresh(inos, conn)
        if retired:
            await self._settle([self.used[b] for b in retired if b in self.used], conn,
                               retired=retired)
        for bid in purged:
            self._purged(bid)
        if preds:
            preds = list(dict.fromkeys(preds))
            replies = await conn.pipeline([("HGETALL", self.redis.key("l", p)) for p in preds])
            for p, r in zip(preds, replies):
                self._set_links(p, _pairs(r))

    def _purged(self, bid: int) -> None:
        rec = self.grave.pop(bid, None)
        if rec is not None and self.used.pop(bid, None) is not None:
            self.pool.unclaim(rec.layout)
            self.purged += 1

    async def catch_up(self, tail: bytes, timeout: float = 10.0) -> bool:
        """Wait until the mirror has applied the log up to `tail`."""
        with trio.move_on_after(timeout):
            while _stream_id(self.last_id) < _stream_id(tail):
                await self._progress.wait()
            return True
        return False

    @property
    def fresh(self) -> bool:
        """True while the mirror is known to be current (within half the grace period): a
        block it names cannot have had its space reused yet."""
        return self.redis.online and not self.catalog_lost and \
            time.monotonic() - self.synced_at < max(2.0, self.cfg.grace_seconds / 2)

    # ------------------------------------------------------------------------------ background
    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._follow)
            nursery.start_soon(self._renew_leases)
            nursery.start_soon(self._purge_periodically)
            task_status.started()
            await trio.sleep_forever()

    async def _renew_leases(self) -> None:
        regions = self.pool.regions
        while True:
            await trio.sleep(self.cfg.lease_seconds / 4)
            held = sorted(regions.deadline)
            if not held:
                continue
            t = time.monotonic()
            try:
                ok = {int(r) for r in await self.redis.eval(_RENEW, [self.token, self.lease_ms, *held])}
            except KvfsError:
                continue                     # the deadlines run out by themselves
            for r in held:
                if r in ok:
                    regions.deadline[r] = t + self.cfg.lease_seconds * LEASE_MARGIN
                else:
                    del regions.deadline[r]
                    self.leases_lost += 1
                    log.warning("cluster: lost the allocation lease on region %d (expired while "
                                "Redis was unreachable?)", r)
            await self._give_back_regions()

    async def _give_back_regions(self) -> None:
        """Release held regions with no writes in flight that are full (no room for a stripe
        unit) or that this node has not allocated in for a lease period, so that another node
        that needs space (space freed there by eviction, say) can lease them."""
        regions = self.pool.regions
        free = self.pool.region_free()
        idle_since = time.monotonic() - self.cfg.lease_seconds
        full = [r for r in regions.held()
                if regions.inflight[r] <= 0 and (free[r][1] < self.pool.unit or
                                                 regions.used_at.get(r, 0.0) < idle_since)]
        if full:
            for r in full:
                regions.deadline.pop(r, None)
            try:
                await self.redis.eval(_RELEASE, [self.token, *full])
            except KvfsError:
                pass                          # they expire instead

    async def release_leases(self) -> None:
        regions = self.pool.regions
        held = [r for r in sorted(regions.deadline) if regions.inflight[r] <= 0]
        for r in held:
            regions.deadline.pop(r, None)
        if held:
            try:
                await self.redis.eval(_RELEASE, [self.token, *held])
            except KvfsError:
                pass

    async def grow(self, need: int) -> bool:
        """Lease another region with room (the emptiest this node knows of). True if one was
        leased; False if none is free."""
        regions = self.pool.regions
        free = self.pool.region_free()
        held = set(regions.held())
        cands = sorted((r for r in range(regions.count)
                        if r not in held and free[r][1] >= min(need, self.pool.unit)),
                       key=lambda r: -free[r][0])[:16]
        if not cands:
            return False
        t = time.monotonic()
        got, tail = await self.redis.eval(_ACQUIRE, [self.token, self.lease_ms, *cands])
        if not got:
            return False
        r = int(got)
        # Whoever held the region before published everything it wrote there before giving
        # it up (or its lease expired): apply the log up to now before allocating in it.
        if not await self.catch_up(tail):
            await self.redis.eval(_RELEASE, [self.token, r])
            raise KvfsError(errno.EIO, "cluster: could not catch up with the change log")
        regions.deadline[r] = t + self.cfg.lease_seconds * LEASE_MARGIN
        regions.used_at[r] = t
        log.debug("cluster: leased region %d (%d bytes free)", r, self.pool.region_free()[r][0])
        return True

    async def purge(self) -> int:
        """Free the space of retired blocks whose grace period is over (any node may do it)."""
        ids = await self.redis.eval(_PURGE, [self.epoch, 256])
        for b in ids:
            self._purged(int(b))
        return len(ids)

    async def hold_graves(self, ids: list[int]) -> int:
        """Blocks retired elsewhere that a reader on this node still uses (an open handle, a
        fetch, a direct-read lease): push their grace period back, so no node purges and reuses
        their space while they are read. Called every quarter of the grace period."""
        if not ids:
            return 0
        return await self.redis.eval(_HOLD, [self.grace_ms, *ids])

    async def _purge_periodically(self) -> None:
        while True:
            await trio.sleep(max(0.2, self.cfg.grace_seconds / 4))
            try:
                await self.purge()
            except KvfsError:
                pass

    @property
    def grave_bytes(self) -> int:
        return sum(r.layout.stored_bytes() for r in self.grave.values())

    async def victims(self, n: int = 32) -> list[int]:
        """Files from least to most recently used across the cluster."""
        return [int(x) for x in await self.redis.call("ZRANGE", self.redis.key("atime"), 0, n - 1)]

    async def try_lock(self, name: str, seconds: float) -> bool:
        """A short cluster-wide lock (e.g. one node at a time cleans the pool)."""
        return bool(await self.redis.call("SET", self.redis.key("lock", name), self.token, "NX",
                                         "PX", int(seconds * 1000)))

    def statistics(self) -> dict:
        regions = self.pool.regions
        return {
            "node_id": self.cfg.node_id, "epoch": self.epoch, "redis": self.redis.where,
            "online": self.redis.online, "fresh": self.fresh, "catalog_lost": self.catalog_lost,
            "lag_seconds": round(time.monotonic() - self.synced_at, 3),
            "events": self.events, "refreshes": self.refreshes, "resyncs": self.resyncs,
            "regions": regions.count, "region_size": regions.size,
            "regions_held": len(regions.held()), "leases_lost": self.leases_lost,
            "fenced_writes": regions.fenced,
            "grave_blocks": len(self.grave), "grave_bytes": self.grave_bytes,
            "purged": self.purged, "redis_calls": self.redis.calls,
            "redis_failures": self.redis.failures,
            "redis_call_ms": round(1000 * self.redis.call_seconds / max(1, self.redis.calls), 3),
        }

    # ------------------------------------------------------------------------------ ids
    def _id(self, attr: str) -> int:
        if getattr(self, attr) & ((1 << EPOCH_SHIFT) - 1) == (1 << EPOCH_SHIFT) - 1:
            raise KvfsError(errno.EOVERFLOW, "this mount has used up its ids; remount")
        return super()._id(attr)

    def next_blob_id(self) -> int:
        return self._id("_next_blob")

    # ------------------------------------------------------------------------------ lookups
    async def lookup_fresh(self, parent: int, name: bytes) -> Node:
        """Like `lookup`, but a name this node does not know is looked up in Redis (another
        node may have created it a moment ago); EIO if Redis cannot be asked."""
        try:
            return self.lookup(parent, name)
        except KvfsError as e:
            if e.errno != errno.ENOENT or parent not in self.nodes:
                raise
        return await self.confirm(parent, name)

    async def confirm(self, parent: int, name: bytes) -> Node:
        """The current record of one name, read from Redis now (for a mirror that is not
        fresh: what it names is then as safe to read as a fresh mirror's); EIO if Redis cannot
        be asked, ENOENT if the name is gone."""
        p = self.nodes.get(parent)
        known = p.children.get(name) if p is not None and p.children is not None else None
        ino = await self.redis.call("HGET", self.redis.key("d", parent), name)
        inos = [int(ino)] if ino is not None else []
        if known is not None and known not in inos:
            inos.append(known)              # renamed or removed meanwhile: the mirror forgets it
        if inos:
            await self._refresh(inos)
        return self.lookup(parent, name)

    # ------------------------------------------------------------------------------ mutations
    def _regions_of(self, layout: Layout) -> str:
        regions = self.pool.regions
        rs = set()
        for e in layout.unit_extents():
            rs.update(regions.touched(e.offset, e.length))
        return " ".join(str(r) for r in sorted(rs))

    async def _own(self, retired: list, leaving: list[BlobRec]) -> None:
        """After one of this node's scripts: the blocks it retired are in the grave; blocks
        that left a file here and are not among them were retired earlier by another node."""
        ids = {int(b) for b in retired}
        for b in ids:
            if b in self.used:
                self.grave[b] = self.used[b]
        try:
            await self._settle(leaving, retired=ids)
        except KvfsError:                 # the change is made; the follower reconciles later
            self._resync = True

    async def _publish_new(self, node: Node, policy: str) -> None:
        """Run MKNODE for a node not yet in Redis, then place it in the mirror."""
        t = time.perf_counter()
        rec = node.blob
        blob = _blob_fields(rec, node.ino) if rec is not None else []
        retired = await self.redis.eval(_MKNODE, [
            self.epoch, node.ino, node.parent, node.name, policy, self.token,
            self._regions_of(rec.layout) if rec else "", self.grace_ms, node.ctime_ns,
            rec.id if rec else "", len(blob) // 2, *blob, *_node_fields(node)])
        self.commits += 1
        self.commit_seconds += time.perf_counter() - t
        leaving: list[BlobRec] = []
        parent = self.nodes[node.parent]
        occupant = parent.children.get(node.name)
        if occupant is not None and occupant != node.ino:     # replaced another node's file
            other = self.nodes[occupant]
            self._vanish(other, leaving)
        node.persisted = True
        if rec is not None:
            self.used[rec.id] = rec
        await self._own(retired, leaving)

    async def _add(self, node: Node) -> None:
        """A new directory or symlink: published in Redis first (EEXIST if another node took
        the name), then in the mirror."""
        await self._publish_new(node, "excl")
        self._place(node)

    async def commit(self, node: Node, layout: Layout) -> tuple[BlobRec, BlobRec | None]:
        """Publish `layout` as the file's content once it is durable on the namespaces: one
        script checks this node still holds the leases of the space and swaps the block in."""
        now = _now()
        rec = BlobRec(self.next_blob_id(), layout, now)
        old = node.blob
        if not node.linked:
            node.blob = rec
            return rec, old
        prev = (node.blob, node.mtime_ns, node.ctime_ns)
        node.blob = rec
        node.mtime_ns = node.ctime_ns = now
        try:
            if not node.persisted:
                await self._publish_new(node, "replace")
                return rec, old
            t = time.perf_counter()
            blob = _blob_fields(rec, node.ino)
            retired = await self.redis.eval(_COMMIT, [
                self.epoch, node.ino, self.token, self._regions_of(layout), self.grace_ms,
                rec.id, len(blob) // 2, *blob,
                b"t", now, b"k", now, b"m", node.mode, b"u", node.uid, b"g", node.gid,
                b"a", node.atime_ns])
            self.commits += 1
            self.commit_seconds += time.perf_counter() - t
        except KvfsError as e:
            node.blob, node.mtime_ns, node.ctime_ns = prev
            if e.errno == errno.ENOENT and node.persisted:
                with trio.CancelScope(shield=True):
                    try:
                        await self._refresh([node.ino])       # removed by another node
                    except KvfsError:
                        pass
            if e.errno == errno.ESTALE:
                log.error("cluster: %s: %s", self.path_of(node), e)
                raise KvfsError(errno.EIO, str(e)) from None
            raise
        self.used[rec.id] = rec
        await self._own(retired, [old] if old is not None else [])
        return rec, old

    async def _remove(self, node: Node, want: str, expect: BlobRec | None = None) -> Node:
        p = self.nodes[node.parent]
        now = _now()
        retired = await self.redis.eval(_REMOVE, [
            self.epoch, node.ino, node.parent, node.name, want,
            expect.id if expect is not None else "", self.grace_ms, now])
        self.commits += 1
        self._detach(node)
        node.ctime_ns = now
        self._forget_links(node.ino)
        p.mtime_ns = p.ctime_ns = now
        await self._own(retired, [node.blob] if node.blob is not None else [])
        return node

    async def remove(self, node: Node, expect: BlobRec | None = None) -> Node:
        """Unlink a file by node (eviction passes the version it chose: if another node has
        rewritten the file meanwhile, ESTALE and nothing changes)."""
        if not node.persisted:
            self._detach(node)
            node.ctime_ns = _now()
            return node
        return await self._remove(node, "file", expect)

    async def rmdir(self, parent: int, name: bytes) -> Node:
        node = self._removable_dir(parent, name)
        return await self._remove(node, "dir")

    async def rename(self, parent_old: int, name_old: bytes, parent_new: int, name_new: bytes,
                     flags: int = 0) -> Node | None:
        src, pold, pnew, target = self._rename_check(parent_old, name_old, parent_new, name_new,
                                                     flags)
        if target is src:
            return None
        if not src.persisted or (target is not None and not target.persisted):
            # A file this node has not committed yet: renamed here only (its commit publishes
            # it under the name it has then).
            return await self._rename_local(src, pold, pnew, name_new, target, flags)
        now = _now()
        cookie = self._id("_next_cookie")
        retired = await self.redis.eval(_RENAME, [
            self.epoch, src.ino, pold.ino, name_old, pnew.ino, name_new, flags, self.grace_ms,
            cookie, target.cookie if target is not None else 0, now])
        self.commits += 1
        leaving: list[BlobRec] = []
        if flags & RENAME_EXCHANGE:
            self._swap(src, target, now)
            return None
        if target is not None:
            self._detach(target)
            self._forget_links(target.ino)
            if target.blob is not None:
                leaving.append(target.blob)
        self._move(src, pold, pnew, name_new, now, cookie)
        await self._own(retired, leaving)
        return target

    async def _rename_local(self, src: Node, pold: Node, pnew: Node, name_new: bytes,
                            target: Node | None, flags: int) -> Node | None:
        if src.persisted or (target is not None and target.persisted) or flags & RENAME_EXCHANGE:
            raise KvfsError(errno.EBUSY, "rename involving a file another name of which is still "
                                         "being written on this node; close it first")
        now = _now()
        if target is not None:
            self._detach(target)
        self._move(src, pold, pnew, name_new, now)
        return target

    async def _update(self, node: Node, fields: list, delete: list | None = None) -> None:
        if not node.persisted or not node.linked:
            return
        await self.redis.eval(_UPDATE, [self.epoch, node.ino, len(fields) // 2, *fields,
                                       *(delete or [])])
        self.commits += 1

    async def setattr(self, node: Node, *, mode: int | None = None, uid: int | None = None,
                      gid: int | None = None, atime_ns: int | None = None,
                      mtime_ns: int | None = None) -> None:
        new_mode = (node.mode & ~0o7777) | (mode & 0o7777) if mode is not None else node.mode
        now = _now()
        fields = [b"m", new_mode, b"u", uid if uid is not None else node.uid,
                  b"g", gid if gid is not None else node.gid,
                  b"a", atime_ns if atime_ns is not None else node.atime_ns,
                  b"t", mtime_ns if mtime_ns is not None else node.mtime_ns, b"k", now]
        await self._update(node, fields)
        node.mode = new_mode
        node.uid, node.gid = fields[3], fields[5]
        node.atime_ns, node.mtime_ns, node.ctime_ns = fields[7], fields[9], now
        self._dirty_atime.discard(node.ino)

    async def set_xattr(self, node: Node, name: bytes, value: bytes) -> None:
        now = _now()
        await self._update(node, [b"x:" + name, value, b"k", now])
        node.xattrs[name] = value
        node.ctime_ns = now

    async def remove_xattr(self, node: Node, name: bytes) -> None:
        if name not in node.xattrs:
            raise KvfsError(errno.ENODATA, f"no such attribute: {name.decode(errors='replace')}")
        now = _now()
        await self._update(node, [b"k", now], [b"x:" + name])
        del node.xattrs[name]
        node.ctime_ns = now

    async def flush_atimes(self) -> int:
        """Persist recorded accesses: the cluster-wide LRU order eviction follows."""
        inos, self._dirty_atime = self._dirty_atime, set()
        args: list = []
        for i in inos:
            n = self.nodes.get(i)
            if n is not None and n.linked and n.persisted:
                args += [i, n.atime_ns, n.atime_ns // 1_000_000]
        if args:
            try:
                await self.redis.eval(_ATIMES, args)
            except KvfsError:
                self._dirty_atime |= inos
                raise
        return len(args) // 3

    # ------------------------------------------------------------------------------ chains
    def link(self, pred: int, succ: int, source: int, weight: float = 1.0) -> None:
        before = self.successors.get(pred, {}).get(succ)
        before = list(before) if before else None
        super().link(pred, succ, source, weight)
        after = self.successors.get(pred, {}).get(succ)
        if after is None or after == before:
            return
        d = self._link_delta.get((pred, succ))
        if d is None or source > d[0]:
            self._link_delta[(pred, succ)] = [source, weight]
        elif source == d[0]:
            d[1] += weight

    def unlink_chain(self, pred: int, succ: int) -> None:
        super().unlink_chain(pred, succ)
        self._link_delta[(pred, succ)] = [0, None]

    async def flush_links(self) -> int:
        """Merge the links learned here into Redis (weights add up across nodes)."""
        self._dirty_links.clear()
        deltas, self._link_delta = self._link_delta, {}
        args: list = [self.epoch]
        later = {}
        for (pred, succ), (source, weight) in deltas.items():
            p, s = self.nodes.get(pred), self.nodes.get(succ)
            if weight is None:
                args += [pred, succ, 0, "-"]
            elif p is not None and s is not None and p.persisted and s.persisted:
                args += [pred, succ, source, weight]
            elif p is not None and s is not None and p.linked and s.linked:
                later[(pred, succ)] = [source, weight]     # with their files, later
        self._link_delta.update(later)
        if len(args) > 1:
            try:
                await self.redis.eval(_LINKS, args)
            except KvfsError:
                for k, v in deltas.items():
                    self._link_delta.setdefault(k, v)
                raise
        return (len(args) - 1) // 4

    async def stop(self) -> None:
        """Unmounting: give back the regions this node holds."""
        await self.release_leases()
        await self.redis.aclose()
