"""A real inference engine through the mount: vLLM (CPU) computes a 2k-token prompt and LMCache's
multiprocess server stores its KV cache on kvfs as chunk files; both processes restart, kvfs's
DRAM tier and the page cache are dropped, and the prompt is served from the mount: every chunk
loaded from the directory (the server's log says so, and kvfs's statistics show the reads), the
same first token as when it was computed. (LMCache's in-process connector has no CPU path and
would silently store nothing: testing/inference.py.) bench/ttft.py times it against ext4."""

from __future__ import annotations

import pytest

from testing import inference

pytestmark = [pytest.mark.slow, pytest.mark.engine, pytest.mark.timeout(900)]

TOKENS = 2048


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
