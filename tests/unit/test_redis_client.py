"""The trio Redis client against a real redis-server."""

import pytest
import trio

from kvfs.redis_client import RedisClient, RedisError, RedisUnavailable
from tests.redis_server import RedisServer, free_port


@pytest.fixture(scope="module")
def redis(tmp_path_factory):
    s = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield s
    s.stop()


def test_commands_pipelines_scripts_and_pubsub(redis):
    async def main():
        r = await RedisClient.connect(redis.url)
        assert await r.call("SET", "k", b"\x00v\r\n") == b"OK"
        assert await r.call("GET", "k") == b"\x00v\r\n"
        assert await r.pipeline([("INCR", "n"), ("INCR", "n"), ("HSET", "h", "a", 1),
                                 ("HGETALL", "h")]) == [1, 2, 1, [b"a", b"1"]]
        assert await r.eval("return {KEYS[1], ARGV[1]}", ["x"], [7]) == [b"x", b"7"]
        with pytest.raises(RedisError):
            await r.call("INCR", "h")
        sub = await RedisClient.connect(redis.url)
        await sub.subscribe("chan")
        await r.call("PUBLISH", "chan", "hello")
        with trio.fail_after(5):
            assert await sub.next_message() == (b"chan", b"hello")
        await r.aclose()
        await sub.aclose()

    trio.run(main)


def test_unreachable_redis_is_reported():
    async def main():
        with pytest.raises(RedisUnavailable, match="cannot reach Redis"):
            await RedisClient.connect(f"redis://127.0.0.1:{free_port()}/0", timeout=2)

    trio.run(main)
