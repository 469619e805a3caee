"""The trio Redis client against a real redis-server."""

import pytest
import trio

from kvfs.redis.resp import RedisClient, RedisError, RedisUnavailable
from testing.redis_server import RedisServer, free_port


@pytest.fixture(scope="module")
def redis(tmp_path_factory):
    s = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield s
    s.stop()


def test_commands_pipelines_and_scripts(redis):
    async def main():
        r = await RedisClient.connect(redis.url)
        assert await r.call("SET", "k", b"\x00v\r\n") == b"OK"
        assert await r.call("GET", "k") == b"\x00v\r\n"
        assert await r.pipeline(
            [("INCR", "n"), ("INCR", "n"), ("HSET", "h", "a", 1), ("HGETALL", "h")]
        ) == [1, 2, 1, [b"a", b"1"]]
        assert await r.eval("return {KEYS[1], ARGV[1]}", ["x"], [7]) == [b"x", b"7"]
        with pytest.raises(RedisError):
            await r.call("INCR", "h")
        await r.aclose()

    trio.run(main)


def test_unreachable_redis_is_reported():
    async def main():
        with pytest.raises(RedisUnavailable, match="cannot reach Redis"):
            await RedisClient.connect(f"redis://127.0.0.1:{free_port()}/0", timeout=2)

    trio.run(main)


def _certs(d):
    """A throw-away CA, a server certificate for 127.0.0.1 and a client certificate."""
    import subprocess

    def run(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=d)

    run(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=kvfs-test-ca",
    )
    (d / "san").write_text("subjectAltName=IP:127.0.0.1\n")
    for who, subj in (("srv", "/CN=127.0.0.1"), ("cli", "/CN=kvfs-node")):
        run(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            f"{who}.key",
            "-out",
            f"{who}.csr",
            "-subj",
            subj,
        )
        run(
            "x509",
            "-req",
            "-in",
            f"{who}.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            f"{who}.pem",
            "-days",
            "2",
            "-extfile",
            "san",
        )
    return d


def _link(url: str, **kw):
    from kvfs.config import ClusterConfig
    from kvfs.redis.link import ClusterLink

    return ClusterLink(ClusterConfig(redis=url, node_id="t", **kw))


def test_password_from_the_url_the_config_or_a_file(tmp_path):
    from kvfs.errors import KvfsError

    s = RedisServer(tmp_path / "r", args=["--requirepass", "s3cret"]).start()
    try:
        (tmp_path / "pw").write_text("s3cret\n")

        async def main():
            for link in (
                _link(f"redis://:s3cret@127.0.0.1:{s.port}/0"),
                _link(s.url, password="s3cret"),
                _link(s.url, password_file=tmp_path / "pw"),
            ):
                assert await link.call("PING") == b"PONG"
                await link.aclose()
            bad = _link(s.url, password="wrong")
            bad.quiet = True
            with pytest.raises(KvfsError) as e:
                await bad.call("PING")
            assert "WRONGPASS" in str(e.value) or "invalid" in str(e.value)
            await bad.aclose()

        trio.run(main)
    finally:
        s.stop()


def test_tls_with_a_private_ca_and_client_certificates(tmp_path):
    from kvfs.errors import KvfsError

    d = _certs(tmp_path)
    s = RedisServer(
        tmp_path / "r",
        tls={"cert": d / "srv.pem", "key": d / "srv.key", "ca": d / "ca.pem", "mutual": True},
    ).start()
    try:

        async def main():
            link = _link(s.url, tls_ca=d / "ca.pem", tls_cert=d / "cli.pem", tls_key=d / "cli.key")
            assert s.url.startswith("rediss://")
            assert await link.call("SET", "k", "over tls") == b"OK"
            assert await link.call("GET", "k") == b"over tls"
            await link.aclose()
            # a server certificate from an unknown CA is refused, with a line saying so
            stranger = _link(s.url, tls_cert=d / "cli.pem", tls_key=d / "cli.key")
            stranger.quiet = True
            with pytest.raises(KvfsError) as e:
                await stranger.call("PING")
            assert "certificate" in str(e.value).lower()
            await stranger.aclose()

        trio.run(main)
    finally:
        s.stop()
