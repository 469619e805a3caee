"""A real inference engine through the mount: vLLM (CPU) computes a 2k-token prompt and LMCache's
multiprocess server stores its KV cache on kvfs as chunk files; both processes restart, kvfs's
DRAM tier and the page cache are dropped, and the prompt is served from the mount: every chunk
loaded from the directory (the server's log says so, and kvfs's statistics show the reads), the
same first token as when it was computed. (LMCache's in-process connector has no CPU path and
would silently store nothing: testing/inference.py.) bench/ttft.py times it against ext4."""

from __future__ import annotations

import pytest

from testing import inference
from tests.helpers import requires_throttle, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.engine, pytest.mark.timeout(900)]

TOKENS = 2048
MiB = 1 << 20


def test_a_prompt_stored_through_the_engine_is_served_from_the_mount(
    make_mount, pool_config, tmp_path
):
    why = inference.available()
    if why:
        pytest.skip(why)
    m = make_mount(pool_config(n=2, size="512MiB", dram="256MiB"))
    model = inference.write_model(tmp_path / "model")
    chunk = inference.CHUNK_TOKENS * inference.kv_bytes_per_token(model)
    ids = inference.prompt(TOKENS, seed=7)
    store = m.mountpoint / "lmcache"
    store.mkdir()
    with (
        inference.LMCacheServer(store, tmp_path / "server.log", l1_gb=1) as server,
        inference.Engine(
            model, tmp_path / "engine.log", port=server.port, kv_cache_gib=1, max_tokens=2 * TOKENS
        ) as engine,
    ):
        _, computed = engine.ttft(ids)
        assert all(x["l2"] == 0 and x["found"] == 0 for x in server.loads())
    files = sorted(store.iterdir())
    assert len(files) == TOKENS // inference.CHUNK_TOKENS, [f.name for f in files]
    assert all(f.stat().st_size >= chunk for f in files), [f.stat().st_size for f in files]

    m.drop_caches()  # kvfs's DRAM tier and the page cache
    fetched = m.stats()["tiers"]["pool"]["bytes_out"]
    with (
        inference.LMCacheServer(store, tmp_path / "server.log", l1_gb=1) as server,
        inference.Engine(
            model, tmp_path / "engine.log", port=server.port, kv_cache_gib=1, max_tokens=2 * TOKENS
        ) as engine,
    ):
        _, served = engine.ttft(ids)
        loads = server.loads()
    assert served == computed
    assert loads and loads[0]["l2"] == len(files) and loads[0]["l1"] == 0, loads
    assert m.stats()["tiers"]["pool"]["bytes_out"] - fetched >= len(files) * chunk


@requires_throttle
def test_a_stalled_namespace_costs_the_engine_a_recompute_not_a_hang(make_mount, tmp_path):
    """Issue 58 with a real engine: vLLM (CPU) and LMCache's server store a prompt's KV cache on
    kvfs (two loop-device namespaces); both restart cold and namespace 1 stalls (4 KiB/s)
    while the prompt is served. kvfs waits one read deadline, then refuses the stalled
    namespace's reads at once: every chunk has units on it, so each open answers ENOENT,
    which LMCache's fs adapter takes for a miss, and vLLM recomputes the prompt: the same
    first token, within a few seconds of the time it took to compute it (a 20 s deadline
    fails this). Healed, the prompt is served from the mount again."""
    from bench.faults import formatted
    from testing.emulate import Emulation

    why = inference.available()
    if why:
        pytest.skip(why)
    model = inference.write_model(tmp_path / "model")
    ids = inference.prompt(TOKENS, seed=11)

    def serve(store, log: str):
        with (
            inference.LMCacheServer(store, tmp_path / f"{log}.server.log", l1_gb=1) as server,
            inference.Engine(
                model,
                tmp_path / f"{log}.engine.log",
                port=server.port,
                kv_cache_gib=1,
                max_tokens=2 * TOKENS,
            ) as engine,
        ):
            seconds, token = engine.ttft(ids)
            return seconds, token, server.loads()

    with Emulation("2g") as emu:
        devs = [emu.loop(f"e{i}", 512 * MiB) for i in range(2)]
        m = make_mount(formatted(tmp_path, [d.path for d in devs], dram="256MiB"))
        store = m.mountpoint / "lmcache"
        store.mkdir()
        computed_s, computed, _ = serve(store, "compute")
        files = sorted(store.iterdir())
        assert len(files) == TOKENS // inference.CHUNK_TOKENS, [f.name for f in files]
        m.sync()
        m.drop_caches()
        group = emu.cgroup("kvfs-engine-stall")
        try:
            group.limit(devs[1], read_bps=4096)
            group.add(m.pid)
            stalled_s, stalled, loads = serve(store, "stalled")
        finally:
            group.limit(devs[1])
            group.remove()
        ns1 = m.stats()["namespaces"][1]
        assert stalled == computed, (stalled, computed, loads)
        assert sum(x["l2"] for x in loads) == 0, loads  # (a request that loads none logs none)
        assert ns1["read_timeouts"] >= 1 and ns1["reads_refused"] >= 1, ns1
        assert stalled_s <= computed_s + 5.0, (stalled_s, computed_s, ns1)
        wait_until(lambda: m.stats()["namespaces"][1]["read_state"] == "ok", 30, "the heal")
        m.drop_caches()
        _, healed, loads = serve(store, "healed")
    assert healed == computed
    assert loads and loads[0]["l2"] == len(files), loads
