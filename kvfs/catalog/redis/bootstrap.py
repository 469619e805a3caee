"""Joining a shared pool's catalog in Redis at start-up, and creating it (`kvfs format`, or the
first node to start on fresh namespaces)."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
import uuid
from typing import Callable

import trio

from kvfs.catalog.records import ROOT_INO
from kvfs.catalog.redis.codec import pairs
from kvfs.catalog.redis.scripts import SCRIPTS
from kvfs.catalog.redis.shards import shard_of
from kvfs.catalog.tree import _now
from kvfs.config import ClusterConfig
from kvfs.errors import KvfsError, StartupError
from kvfs.pool.pool import Pool
from kvfs.redis.link import ClusterLink

log = logging.getLogger("kvfs.catalog")

# 2: the publish script stores a new file's node and its block packed (kvfs.catalog.redis.codec).
# This kvfs reads schema 1's records as they are; a kvfs that knows only 1 cannot read 2's.
SCHEMA_VERSION = "2"
EPOCH_SHIFT = 32  # inode, cookie and block ids: (node epoch << 32) | counter
SCAN_BATCH = 500
INIT_LOCK_SECONDS = 120


async def connect(cfg: ClusterConfig) -> ClusterLink:
    """A link to the cluster's Redis; StartupError (one line) if it cannot be reached. The link
    is quiet (failures raise, nothing is logged) until the caller calls `link.started()`."""
    link = ClusterLink(cfg)
    link.quiet = True
    try:
        await link.call("PING")
    except KvfsError as e:
        await link.aclose()
        raise StartupError(f"cluster.redis: {e}", errno.EHOSTUNREACH) from None
    return link


@contextlib.asynccontextmanager
async def init_lock(link: ClusterLink):
    """Hold the cluster's creation lock (one node at a time formats or creates the catalog);
    yields the catalog's meta hash as it is under the lock (empty if there is none)."""
    me = uuid.uuid4().hex
    with trio.move_on_after(INIT_LOCK_SECONDS) as waited:
        while not await link.call(
            "SET", link.key("init"), me, "NX", "PX", INIT_LOCK_SECONDS * 1000
        ):
            await trio.sleep(0.2)
    if waited.cancelled_caught:
        raise StartupError(
            "cluster: another node has been creating the pool for two minutes; "
            "remove the key " + link.key("init") + " if it died"
        )
    try:
        yield pairs(await link.call("HGETALL", link.key("meta")))
    finally:
        with trio.CancelScope(shield=True):
            await link.eval(SCRIPTS.unlock_init, [me], durable=False)


async def connect_shards(cfg: ClusterConfig) -> list[ClusterLink]:
    """Links to the pool's shards past the first (`[cluster] shards`), quiet as `connect`'s."""
    links: list[ClusterLink] = []
    try:
        for k in range(1, cfg.shard_count):
            try:
                links.append(await connect(cfg.shard(k)))
            except StartupError as e:
                raise StartupError(f"cluster.shards[{k - 1}]: {e}", e.errno) from None
    except BaseException:
        for link in links:
            await link.aclose()
        raise
    return links


async def create_catalog(
    link: ClusterLink, pool_id: str, shard: int = 0, shards: int = 1
) -> dict[bytes, bytes]:
    """An empty catalog of `pool_id` in shard `shard` of `shards`: its meta hash, and the root
    directory in the shard that holds the root's entries."""
    meta = {
        b"pool_id": pool_id.encode(),
        b"schema": SCHEMA_VERSION.encode(),
        b"shard": str(shard).encode(),
        b"shards": str(shards).encode(),
    }
    if shard_of(ROOT_INO, shards) != shard:
        got = await link.eval(SCRIPTS.init, [pool_id, SCHEMA_VERSION, shard, shards])
        return {**meta, b"pool_id": got}
    now = _now()
    root = [
        b"p",
        ROOT_INO,
        b"n",
        b"",
        b"c",
        0,
        b"m",
        stat.S_IFDIR | 0o755,
        b"u",
        os.geteuid(),
        b"g",
        os.getegid(),
        b"a",
        now,
        b"t",
        now,
        b"k",
        now,
        b"d",
        1,
    ]
    if shards > 1:
        root += [b"h", shard]
    got = await link.eval(SCRIPTS.init, [pool_id, SCHEMA_VERSION, shard, shards, *root])
    where = f"in Redis at {link.where}"
    if shards > 1:  # (every shard was formatted; this one holds the root directory)
        where = f"over {shards} shards (its root directory in the one at {link.where})"
    log.info("cluster: created the catalog of pool %s %s", got.decode(), where)
    return {**meta, b"pool_id": got}


async def scan(conn, pattern: str) -> list[bytes]:
    keys, cursor = [], b"0"
    while True:
        cursor, batch = await conn.call("SCAN", cursor, "MATCH", pattern, "COUNT", SCAN_BATCH)
        keys += batch
        if cursor == b"0":
            return keys


def _check_meta(meta: dict, link: ClusterLink, shard: int, shards: int) -> None:
    """A shard's meta hash against this node's configuration."""
    if meta.get(b"schema") == b"1":
        raise StartupError(
            f"cluster: Redis at {link.where} holds a kvfs catalog of schema 1, written by an "
            f"older kvfs, which cannot read the records this one writes (schema "
            f"{SCHEMA_VERSION}). Once no node of the pool runs the older kvfs, upgrade it: "
            f"`redis-cli HSET '{link.prefix}meta' schema {SCHEMA_VERSION}` on every shard "
            f"(its records are read as they are)"
        )
    if meta.get(b"schema") != SCHEMA_VERSION.encode():
        raise StartupError(
            f"cluster: Redis holds kvfs catalog schema {meta.get(b'schema')!r}; "
            f"this kvfs uses {SCHEMA_VERSION}"
        )
    held = (int(meta.get(b"shard", 0)), int(meta.get(b"shards", 1)))
    if held != (shard, shards):
        raise StartupError(
            f"cluster: Redis at {link.where} holds shard {held[0]} of {held[1]} of the pool's "
            f"catalog under {link.prefix!r}, but this node's configuration makes it shard "
            f"{shard} of {shards} (cluster.redis and cluster.shards, in the same order on "
            f"every node; a pool's shards cannot be changed: `kvfs format --force` starts over)"
        )


async def join(
    link: ClusterLink, open_pool: Callable[[str | None], Pool], shards: list[ClusterLink] = ()
) -> Pool:
    """Bind this node to the pool whose catalog Redis holds (`open_pool(pool_id)` opens and
    validates the namespaces). With no catalog yet, one node (under the creation lock) formats
    the namespaces (`open_pool(None)`) and creates it, in every shard (`shards`: the links
    to the shards past the first). Takes this mount's epoch (the high half of every id it
    makes) and lease token. Returns the pool; the caller closes it on failure."""
    count = 1 + len(shards)
    meta = pairs(await link.call("HGETALL", link.key("meta")))
    if meta:
        _check_meta(meta, link, 0, count)
    pool = None
    if not meta:
        async with init_lock(link) as meta:
            if not meta:
                pool = open_pool(None)
                if not pool.created:
                    pool.close()
                    raise StartupError(
                        f"the namespaces hold pool {pool.pool_id}, but Redis has no catalog for "
                        f"it under {link.prefix!r} (wrong cluster.name or database, or Redis "
                        f"lost its data?); to start over, run `kvfs format --force`"
                    )
                try:
                    for k, other in enumerate(shards, 1):
                        await create_catalog(other, pool.pool_id, k, count)
                    meta = await create_catalog(link, pool.pool_id, 0, count)
                except BaseException:
                    pool.close()
                    raise
    if pool is None:
        pool = open_pool(meta[b"pool_id"].decode())
    try:
        for k, other in enumerate(shards, 1):
            got = pairs(await other.call("HGETALL", other.key("meta")))
            if got.get(b"pool_id") != meta[b"pool_id"]:
                raise StartupError(
                    f"cluster.shards[{k - 1}]: Redis at {other.where} holds no catalog of pool "
                    f"{meta[b'pool_id'].decode()} under {other.prefix!r} (a shard added to a "
                    f"pool, or one that lost its data?); to start over, run "
                    f"`kvfs format --force`"
                )
            _check_meta(got, other, k, count)
    except BaseException:
        pool.close()
        raise
    try:
        # replicated before use: a master promoted after losing this INCR would hand the
        # same epoch, and so the same ids, to the next node that mounts
        epoch = await link.call_durable("INCR", link.key("epoch"))
        if epoch >= 1 << 31:
            raise StartupError("cluster: node epochs exhausted (more than 2^31 mounts)")
        link.epoch = epoch
        link.token = f"{link.cfg.node_id}/{epoch}/{uuid.uuid4().hex[:8]}"
        for other in shards:
            other.epoch, other.token = link.epoch, link.token
    except BaseException:
        pool.close()
        raise
    return pool


async def format_catalog(cfg: ClusterConfig, format_pool: Callable[[], str], *, force: bool) -> str:
    """`kvfs format` with a [cluster] config: write new superblocks (`format_pool()`) and
    create an empty catalog in Redis, discarding an old one only with `force`. Refuses while
    any node holds a lease (a mounted node is using the pool). Returns the pool id."""
    link = await connect(cfg)
    try:
        shards = await connect_shards(cfg)
    except BaseException:
        await link.aclose()
        raise
    try:
        async with init_lock(link) as meta:
            if meta and not force:
                raise StartupError(
                    f"Redis at {link.where} already holds the catalog of pool "
                    f"{meta.get(b'pool_id', b'?').decode()} under {link.prefix!r}; refusing "
                    f"to start a new pool over it (use --force to discard it)",
                    errno.EEXIST,
                )
            leases = await scan(link, link.key("lease:*"))
            if leases:
                holders = sorted(
                    {
                        (await link.call("GET", k) or b"?").decode().split("/")[0]
                        for k in leases[:64]
                    }
                )
                raise StartupError(
                    f"node(s) {', '.join(holders)} hold leases on the pool "
                    f"(still mounted?): unmount every node first",
                    errno.EBUSY,
                )
            pool_id = format_pool()
            count = 1 + len(shards)
            for other in [link, *shards]:
                old = [
                    x
                    for x in await scan(other, other.prefix + "*")
                    if x != link.key("init").encode()
                ]
                for i in range(0, len(old), 512):
                    await other.call("UNLINK", *old[i : i + 512])
            for k, other in enumerate(shards, 1):
                await create_catalog(other, pool_id, k, count)
            await create_catalog(link, pool_id, 0, count)
            return pool_id
    finally:
        with trio.CancelScope(shield=True):
            for other in shards:
                await other.aclose()
            await link.aclose()
