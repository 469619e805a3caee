import re
from pathlib import Path

import pytest

from kvfs import config
from kvfs.errors import ConfigError
from kvfs.units import format_size, parse_size


def load_text(tmp_path: Path, text: str) -> config.Config:
    p = tmp_path / "kvfs.toml"
    p.write_text(text)
    return config.load(p)


def test_sizes_parse_like_people_write_them():
    assert parse_size("4GiB") == 4 << 30
    assert parse_size("512 KiB") == 512 << 10
    assert parse_size("1.5G") == 3 << 29
    assert parse_size("10MB") == 10_000_000
    assert parse_size(4096) == 4096
    for bad in ("lots", "-1G", "4 GiBs", True, 1.5):
        with pytest.raises(ValueError):
            parse_size(bad)
    assert format_size(3 << 29) == "1.5 GiB"


def test_embedded_default_is_one_file_namespace_under_the_state_dir():
    cfg = config.load(None)
    assert len(cfg.pool.namespaces) == 1
    ns = cfg.pool.namespaces[0]
    assert cfg.state_dir in ns.path.parents
    assert ns.size is not None and ns.size <= config.DEFAULT_POOL_FILE_SIZE
    assert 0 < cfg.dram.capacity <= config.DEFAULT_DRAM_CAPACITY
    assert cfg.pool.evict == "prefix"
    assert cfg.pool.stripe_unit == 1 << 20
    assert cfg.pool.io_engine == "auto"


def test_full_config_is_typed(tmp_path):
    cfg = load_text(
        tmp_path,
        """
state_dir = "state"
log_level = "debug"
[dram]
capacity = "2GiB"
[mount]
allow_other = true
[pool]
evict = "never"
stripe_unit = "256KiB"
io_engine = "threads"
[[pool.namespace]]
path = "/dev/nvme1n1"
queue_depth = 32
[[pool.namespace]]
path = "ns1.img"
size = "4GiB"
weight = 0.5
""",
    )
    assert cfg.state_dir == tmp_path / "state"
    assert cfg.dram.capacity == 2 << 30
    assert cfg.mount.allow_other is True
    assert cfg.pool.evict == "never"
    assert cfg.pool.stripe_unit == 256 << 10
    assert cfg.pool.io_engine == "threads"
    a, b = cfg.pool.namespaces
    assert a.path == Path("/dev/nvme1n1") and a.size is None and a.queue_depth == 32
    assert b.path == tmp_path / "ns1.img" and b.size == 4 << 30 and b.weight == 0.5


NS = "[[pool.namespace]]\npath = '/dev/nvme1n1'\n"


@pytest.mark.parametrize(
    "text, message",
    [
        ("[pool]\nevcit = 'lru'\n", "config: unknown key pool.evcit"),
        ("colour = 1\n", "config: unknown key colour"),
        (
            "[dram]\ncapacity = 'lots'\n",
            "config: dram.capacity: expected a size like '4GiB', got 'lots'",
        ),
        ("[dram]\ncapacity = 0\n", "config: dram.capacity: must be greater than zero"),
        (
            "[pool]\nevict = 'fifo'\n",
            "config: pool.evict: expected 'lru' or 'prefix' or 'never', got 'fifo'",
        ),
        ("[pool]\nstripe_unit = '3MiB'\n", "config: pool.stripe_unit: must be a power of two"),
        (
            "[pool]\nio_engine = 'uring'\n",
            "config: pool.io_engine: expected 'auto' or 'threads', got 'uring'",
        ),
        ("[[pool.namespace]]\nsize = '1GiB'\n", "config: pool.namespace[0].path: missing"),
        (
            "[[pool.namespace]]\npath = 'a'\nqueue_depth = 0\n",
            "config: pool.namespace[0].queue_depth: expected an integer from 1 to 256, got 0",
        ),
        (
            "[[pool.namespace]]\npath = 'a'\nsize = '1000'\n",
            "config: pool.namespace[0].size: must be a multiple of 4KiB",
        ),
        ("[[pool.namespace]]\npath = 'a'\n[[pool.namespace]]\npath = 'a'\n", "is listed twice"),
        ("[mount]\nallow_other = 'yes'\n", "config: mount.allow_other: expected true or false"),
        ("dram = 3\n", "config: dram: expected a table"),
        ("[pool\n", "not valid TOML"),
        ("[cluster]\nnode_id = 'a'\n", "config: cluster.redis: missing"),
        ("[cluster]\nredis = 'http://x'\n", "config: cluster.redis: expected redis://host:port/db"),
        (
            "[cluster]\nredis = 'redis://x/abc'\n",
            "config: cluster.redis: the database must be a number",
        ),
        ("[cluster]\nredis = 'redis://x:6379/0'\n", "every node must mount the same namespaces"),
        (
            "[cluster]\nredis = 'redis://x:6379/0'\nname = 'a:b'\n" + NS,
            "config: cluster.name: must be",
        ),
        (
            "[cluster]\nredis = 'redis://x:6379/0'\ntls_ca = 'ca.pem'\n" + NS,
            "TLS options need a rediss:// URL",
        ),
        (
            "[cluster]\nredis = 'redis://x:6379/0'\ngrace_seconds = 0\n" + NS,
            "config: cluster.grace_seconds: expected a number from 0.5 to 3600.0, got 0",
        ),
        (
            "[cluster]\nsentinels = ['s1:26379']\nredis = 'redis://x:6379/0'\n" + NS,
            "config: cluster.redis: with sentinels, name no host",
        ),
        (
            "[cluster]\nsentinels = ['s1']\n" + NS,
            'config: cluster.sentinels[0]: expected "host:port"',
        ),
        (
            "[cluster]\nsentinels = []\n" + NS,
            "config: cluster.sentinels: expected a non-empty list",
        ),
        (
            "[cluster]\nsentinels = ['s:1']\nno_replica = 'retry'\n" + NS,
            "config: cluster.no_replica: expected 'fail' or 'wait'",
        ),
        (
            "[cluster]\nsentinels = ['s:1']\nconfirm = 'most'\n" + NS,
            "config: cluster.confirm: expected 'all' or 'up'",
        ),
        (
            "[cluster]\nredis = 'redis://x:6379/0'\nsentinel_password = 'p'\n" + NS,
            "sentinel_password needs cluster.sentinels",
        ),
        (
            "[cluster]\nredis = 'redis://x:6379/0'\nfollow_replicas = true\n" + NS,
            "cluster.follow_replicas: needs cluster.sentinels",
        ),
        (
            "[cluster]\nsentinels = ['s:26379']\nconfirm = 'up'\nfollow_replicas = true\n" + NS,
            'confirm = "all"',
        ),
        (
            "[cluster]\nsentinels = ['s:26379']\nfollow_replicas = 'yes'\n" + NS,
            "cluster.follow_replicas: expected true or false",
        ),
    ],
)
def test_bad_config_gets_one_line_naming_the_key(tmp_path, text, message):
    with pytest.raises(ConfigError) as e:
        load_text(tmp_path, text)
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_cluster_section(tmp_path):
    cfg = load_text(
        tmp_path,
        """
state_dir = "state"
[cluster]
redis = "rediss://:secret@redis.example:6380/2"
node_id = "gpu-7"
tls_ca = "ca.pem"
grace_seconds = 5
[[pool.namespace]]
path = "/dev/nvme1n1"
""",
    )
    c = cfg.cluster
    assert c.redis == "rediss://:secret@redis.example:6380/2" and c.node_id == "gpu-7"
    assert c.tls_ca == tmp_path / "ca.pem" and c.grace_seconds == 5.0 and c.lease_seconds == 10.0
    assert c.name == "kvfs" and c.regions == 64
    assert c.sentinels == () and c.min_replicas == 0 and c.where == "redis.example:6380"
    s = load_text(
        tmp_path,
        """
[cluster]
sentinels = ["10.0.0.1:26379", "[::1]:26380"]
master_name = "kv"
redis = "rediss://:pw@/3"
[[pool.namespace]]
path = "/dev/nvme1n1"
""",
    ).cluster
    assert s.sentinels == (("10.0.0.1", 26379), ("::1", 26380)) and s.master_name == "kv"
    assert s.redis == "rediss://:pw@/3" and s.min_replicas == 1 and s.no_replica == "fail"
    assert s.replica_timeout_ms == 1000 and "via sentinels 10.0.0.1:26379" in s.where
    assert s.confirm == "all"
    with pytest.raises(ConfigError, match="inside state_dir"):
        load_text(
            tmp_path,
            """
state_dir = "state"
[cluster]
redis = "redis://h:1/0"
[[pool.namespace]]
path = "state/ns0.img"
size = "64MiB"
""",
        )


def test_cluster_shards(tmp_path):
    """[cluster] shards: the pool's other Redis shards, URLs (master names with sentinels);
    each shard's own settings keep the rest and take their own Redis and key prefix."""
    ns = '[[pool.namespace]]\npath = "/dev/nvme1n1"\n'
    c = load_text(
        tmp_path,
        '[cluster]\nredis = "redis://a:1/0"\nshards = ["redis://b:2/0", "redis://c:3/1"]\n' + ns,
    ).cluster
    assert c.shard_count == 3 and c.shard(0) is c
    assert (c.shard(2).redis, c.shard(2).name, c.shard(2).shards) == ("redis://c:3/1", "kvfs#2", ())
    assert c.shard(1).lease_seconds == c.lease_seconds
    s = load_text(
        tmp_path,
        '[cluster]\nsentinels = ["h:26379"]\nmaster_name = "kv0"\nshards = ["kv1", "kv2"]\n' + ns,
    ).cluster
    assert s.shard(1).master_name == "kv1" and s.shard(1).sentinels == (("h", 26379),)
    assert load_text(tmp_path, '[cluster]\nredis = "redis://a:1/0"\n' + ns).cluster.shard_count == 1
    for bad, what in [
        ('shards = "redis://b:2/0"', "expected a non-empty list"),
        ("shards = []", "expected a non-empty list"),
        ('shards = ["b:2"]', "cluster.shards[0]"),
        ('shards = ["redis://b:2/0", "redis://b:2/0"]', "named twice"),
    ]:
        with pytest.raises(ConfigError, match=re.escape(what)):
            load_text(tmp_path, '[cluster]\nredis = "redis://a:1/0"\n' + bad + "\n" + ns)


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="file not found"):
        config.load(tmp_path / "nope.toml")


def test_every_toml_example_in_the_docs_is_a_valid_config(tmp_path):
    """The README and docs show configs users copy: each must load as it is."""
    import re

    from tests.helpers import ROOT

    found = 0
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for i, m in enumerate(re.finditer(r"```toml\n(.*?)```", doc.read_text(), re.S)):
            path = tmp_path / f"{doc.stem}-{i}.toml"
            path.write_text(m.group(1))
            config.load(path)
            found += 1
    assert found >= 3
    config.load(ROOT / "mount" / "kvfs.example.toml")


def test_durability_defaults_to_fsync_on_one_node_and_in_a_shared_pool(tmp_path):
    ns = '[[pool.namespace]]\npath = "/tmp/x.img"\nsize = "64MiB"\n'
    m = load_text(tmp_path, ns).mount
    assert m.durability == "fsync" and m.writeback_ms == 100
    m = load_text(
        tmp_path,
        ns + '[dram]\ncapacity = "2GiB"\n[mount]\ndurability = "close"\n'
        'writeback_ms = 250\ndirty_limit = "64MiB"\n',
    ).mount
    assert (m.durability, m.writeback_ms, m.dirty_limit) == ("close", 250, 64 << 20)
    assert load_text(tmp_path, ns + '[dram]\ncapacity = "2GiB"\n').mount.dirty_limit == 512 << 20
    assert load_text(tmp_path, ns + '[dram]\ncapacity = "32MiB"\n').mount.dirty_limit == 16 << 20
    cluster = '[cluster]\nredis = "redis://localhost:6379/0"\nnode_id = "a"\n'
    assert load_text(tmp_path, cluster + ns).mount.durability == "fsync"  # (shared too)
    # the kernel keeps names 30 s on one node (invalidation is exact there), 1 s when shared
    assert load_text(tmp_path, ns).mount.attr_timeout == 30.0
    assert load_text(tmp_path, cluster + ns).mount.attr_timeout == 1.0
    for bad, what in [
        ('durability = "sometimes"', "mount.durability"),
        ("writeback_ms = 0", "mount.writeback_ms"),
        ("writeback_ms = 60001", "mount.writeback_ms"),
        ('dirty_limit = "-1"', "mount.dirty_limit"),
    ]:
        with pytest.raises(ConfigError, match=what):
            load_text(tmp_path, ns + "[mount]\n" + bad + "\n")
    # a shared pool writes back too (a batch of files published in one script call)
    assert (
        load_text(tmp_path, cluster + ns + '[mount]\ndurability = "fsync"\n').mount.durability
        == "fsync"
    )
