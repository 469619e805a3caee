"""kvfs's Lua scripts (kvfs/catalog/redis/lua/) load into a real redis-server, and the helpers
they share behave."""

from __future__ import annotations

import trio

from kvfs.catalog.redis.scripts import NAMES, SCRIPTS
from kvfs.cluster.resp import RedisClient


def test_every_script_compiles_in_redis(redis):
    async def main():
        r = await RedisClient.connect(redis.url)
        try:
            for name in NAMES:
                sha = await r.call("SCRIPT", "LOAD", getattr(SCRIPTS, name))
                assert len(sha) == 40, name
            assert set(SCRIPTS.all()) == set(NAMES)
        finally:
            await r.aclose()

    trio.run(main)


def test_leases_acquire_renew_release_against_redis(redis):
    """The lease scripts: a region is taken by one token only, renewed only by its holder,
    and released only by it."""

    async def main():
        r = await RedisClient.connect(redis.url)
        p = ["kvfs:{t}:"]
        try:
            got, tail = await r.eval(SCRIPTS.acquire, p, ["a", 10_000, 3, 4])
            assert got == b"3" and tail == b"0-0"
            got, _ = await r.eval(SCRIPTS.acquire, p, ["b", 10_000, 3, 4])
            assert got == b"4"  # 3 is a's
            assert await r.eval(SCRIPTS.renew, p, ["a", 10_000, 3, 4]) == [b"3"]
            assert await r.eval(SCRIPTS.release, p, ["b", 3]) == 0  # not b's to give
            assert await r.eval(SCRIPTS.release, p, ["a", 3]) == 1
            got, _ = await r.eval(SCRIPTS.acquire, p, ["b", 10_000, 3])
            assert got == b"3"
        finally:
            await r.aclose()

    trio.run(main)
