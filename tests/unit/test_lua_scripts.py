"""kvfs's Lua scripts (kvfs/catalog/redis/lua/) load into a real redis-server, and the helpers
they share behave."""

from __future__ import annotations

import trio

from kvfs.catalog.redis.scripts import NAMES, SCRIPTS
from kvfs.redis.resp import RedisClient


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


def test_a_publish_entry_carries_exactly_the_records_it_stored(redis):
    """PUBLISH's change-log entry carries each record packed in one field (codec.pack): what
    the followers install must be exactly what Redis stored (read back as `record` expands
    it), a new file's whole node hash and block record, a new version's changed fields. A new
    file is stored packed, unless it has xattrs (stored field by field: removexattr deletes
    one), and a field set later overrides its packed value."""
    import stat

    from kvfs.catalog.records import BlobRec, Node
    from kvfs.catalog.redis.codec import (
        blob_fields,
        node_fields,
        pairs,
        parse_entry,
        publish_args,
        record,
        score_fields,
    )
    from kvfs.pool.layout import Layout

    async def main():
        r = await RedisClient.connect(redis.url)
        P = "kvfs:{e}:"
        try:
            await r.call("HSET", P + "n:1", "d", 1, "p", 1, "n", "")
            await r.call("SET", P + "lease:0", "tok")
            lay = Layout(9000, 4096, (0, 1, 0), (8192, 8192, 12288), (1, 2**64 - 1, 7))
            node = Node(77, 1, b"chunk\x00\xff", stat.S_IFREG | 0o644, 0, 0, 5, 6, 7, cookie=77)
            node.prio, node.uses = 0.1 + 0.2, 3
            node.xattrs = {b"user.k": b"\x00binary\r\n"}
            rec = BlobRec(501, lay, 1_700_000_000_123_456_789)
            node.blob = rec

            async def publish(kind, rec, fields):
                args = publish_args(
                    *(node.ino, 1, node.name, kind, "0", rec.id, b"", node.prio),
                    blob_fields(rec, node.ino),
                    fields,
                )
                _, failed, _ = await r.eval(SCRIPTS.publish, [P], ["9", "tok", 1000, 8, 1, *args])
                assert failed == []
                (_, flat), *_ = await r.call("XREVRANGE", P + "log", "+", "-", "COUNT", 1)
                return {(tag, key): f for tag, key, f in parse_entry(flat)[1]}

            got = await publish(b"new", rec, node_fields(node))
            stored = pairs(await r.call("HGETALL", P + "n:77"))
            assert b"*" not in stored and got[(b"@n", b"77")] == stored  # (it has an xattr)
            assert got[(b"@b", b"501")] == record(await r.call("HGETALL", P + "b:501"))
            assert list(pairs(await r.call("HGETALL", P + "b:501"))) == [b"*"]
            assert got[(b"@n", b"77")][b"x:user.k"] == b"\x00binary\r\n"

            rec2 = BlobRec(502, lay, 9)
            changed = [b"b", 502, b"t", 11, b"k", 11, *score_fields(node)]
            got = await publish(b"old", rec2, changed)
            now = record(await r.call("HGETALL", P + "n:77"))
            update = got[(b"@u", b"77")]
            assert update == {k: now[k] for k in update} and update[b"b"] == b"502"
            assert got[(b"@b", b"502")] == record(await r.call("HGETALL", P + "b:502"))
            assert await r.call("ZSCORE", P + "prio", 77) == repr(node.prio).encode()

            # a new file without xattrs: packed; what is set or removed later goes over it
            node.ino, node.name, node.xattrs = 78, b"plain", {}
            rec3 = BlobRec(503, lay, 10)
            node.blob = rec3
            got = await publish(b"new", rec3, node_fields(node))
            stored = pairs(await r.call("HGETALL", P + "n:78"))
            assert sorted(stored) == [b"*", b"b", b"n", b"p"]
            assert got[(b"@n", b"78")] == record(await r.call("HGETALL", P + "n:78"))
            update = [b"9", 78, 2, b"m", 0o600, b"x:user.a", b"v"]
            await r.eval(SCRIPTS.update, [P], update)
            h = record(await r.call("HGETALL", P + "n:78"))
            assert int(h[b"m"]) == 0o600 and h[b"x:user.a"] == b"v" and h[b"t"] == b"6"
            await r.eval(SCRIPTS.update, [P], [b"9", 78, 0, b"x:user.a"])
            assert b"x:user.a" not in record(await r.call("HGETALL", P + "n:78"))
        finally:
            await r.aclose()

    trio.run(main)
