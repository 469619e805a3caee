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

from kvfs.catalog.base import ROOT_INO
from kvfs.catalog.redis.codec import pairs
from kvfs.catalog.redis.scripts import SCRIPTS
from kvfs.catalog.tree import _now
from kvfs.cluster.link import ClusterLink
from kvfs.config import ClusterConfig
from kvfs.errors import KvfsError, StartupError
from kvfs.pool.pool import Pool

log = logging.getLogger("kvfs.catalog")

SCHEMA_VERSION = "1"
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


async def create_catalog(link: ClusterLink, pool_id: str) -> dict[bytes, bytes]:
    """An empty catalog of `pool_id`: its meta hash and the root directory."""
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
    got = await link.eval(SCRIPTS.init, [pool_id, SCHEMA_VERSION, *root])
    log.info("cluster: created the catalog of pool %s in Redis at %s", got.decode(), link.where)
    return {b"pool_id": got, b"schema": SCHEMA_VERSION.encode()}


async def scan(conn, pattern: str) -> list[bytes]:
    keys, cursor = [], b"0"
    while True:
        cursor, batch = await conn.call("SCAN", cursor, "MATCH", pattern, "COUNT", SCAN_BATCH)
        keys += batch
        if cursor == b"0":
            return keys


async def join(link: ClusterLink, open_pool: Callable[[str | None], Pool]) -> Pool:
    """Bind this node to the pool whose catalog Redis holds (`open_pool(pool_id)` opens and
    validates the namespaces). With no catalog yet, one node (under the creation lock) formats
    the namespaces (`open_pool(None)`) and creates it. Takes this mount's epoch (the high half
    of every id it makes) and lease token. Returns the pool; the caller closes it on failure."""
    meta = pairs(await link.call("HGETALL", link.key("meta")))
    if meta and meta.get(b"schema") != SCHEMA_VERSION.encode():
        raise StartupError(
            f"cluster: Redis holds kvfs catalog schema {meta.get(b'schema')!r}; "
            f"this kvfs uses {SCHEMA_VERSION}"
        )
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
                meta = await create_catalog(link, pool.pool_id)
    if pool is None:
        pool = open_pool(meta[b"pool_id"].decode())
    try:
        # replicated before use: a master promoted after losing this INCR would hand the
        # same epoch, and so the same ids, to the next node that mounts
        epoch = await link.call_durable("INCR", link.key("epoch"))
        if epoch >= 1 << 31:
            raise StartupError("cluster: node epochs exhausted (more than 2^31 mounts)")
        link.epoch = epoch
        link.token = f"{link.cfg.node_id}/{epoch}/{uuid.uuid4().hex[:8]}"
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
            old = [k for k in await scan(link, link.prefix + "*") if k != link.key("init").encode()]
            for i in range(0, len(old), 512):
                await link.call("UNLINK", *old[i : i + 512])
            await create_catalog(link, pool_id)
            return pool_id
    finally:
        with trio.CancelScope(shield=True):
            await link.aclose()
