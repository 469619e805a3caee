"""kvfs doctor recognizes the engines' directories in a mount and says when an engine's own
index and kvfs's eviction disagree (the file names are those the real libraries write: see
tests/clients/ and tests/lmcache/)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest

from tests.helpers import ROOT

pytestmark = pytest.mark.mounted
MiB = 1 << 20


def doctor(mnt) -> dict[str, dict]:
    r = subprocess.run(
        [sys.executable, "-m", "kvfs", "doctor", str(mnt.mountpoint), "--json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    found = [f for f in json.loads(r.stdout)["findings"] if f["check"] == "clients"]
    return {f["detail"].split(":")[0].rsplit("/", 1)[-1]: f for f in found}


def layouts(root, chunk: int = 64 * 1024) -> None:
    body = os.urandom(chunk)
    lm = root / "lmcache"
    lm.mkdir()
    for h in ("-274654dcc82ea3f3", "1a9e5c7b44d0e112", "52d7e0c1a9f3b886"):
        (lm / f"meta-llama-Llama-3.1-8B@1@0@{h}@bfloat16.pt").write_bytes(body)
    plug = root / "plugin"
    plug.mkdir()
    p = plug / "meta-llama-Llama-3.1-8B@1@0@-0f3c9a1172be6d40@bfloat16.pt"
    p.write_bytes(body)
    os.setxattr(p, "user.lmcache.meta", b'{"shape": [1], "dtype": "torch.uint8", "fmt": "KV_2LTD"}')
    slots = root / "slots"
    slots.mkdir()
    for i in range(4):
        (slots / f"obj_{i}_a1b{i}.bin").write_bytes(body)
    nd = root / "nixl"
    nd.mkdir()
    (nd / "meta-llama_Llama-3.1-8B_1_0_-43910c8d016b07d6_bfloat16").write_bytes(body)
    sg = root / "hicache"
    sg.mkdir()
    for i in range(3):
        (
            sg / f"{hashlib.sha256(str(i).encode()).hexdigest()}_meta-llama-Llama-3.1-8B_0_1.bin"
        ).write_bytes(body)
    vb = root / "vllm" / "meta-llama_Llama-3.1-8B_0123456789ab"
    vb.mkdir(parents=True)
    (vb / "config.json").write_text(json.dumps({"inference_engine": "vllm", "model_name": "m"}))
    blk = root / "vllm" / "meta-llama_Llama-3.1-8B_0123456789ab_r0" / "0a1" / "b2_g0"
    blk.mkdir(parents=True)
    (blk / ("0a1b2" + "0" * 59 + ".bin")).write_bytes(body)
    (root / "other").mkdir()
    (root / "other" / "notes.txt").write_text("not a KV cache")


def test_doctor_names_each_engine_and_warns_where_evictions_disagree(make_mount, pool_config):
    m = make_mount(pool_config(size="64MiB"))
    layouts(m.mountpoint)
    f = doctor(m)
    assert set(f) == {
        "lmcache",
        "plugin",
        "slots",
        "nixl",
        "hicache",
        "meta-llama_Llama-3.1-8B_0123456789ab",
    }
    assert f["lmcache"]["status"] == "info" and "max_local_disk_size" in f["lmcache"]["fix"]
    assert f["slots"]["status"] == "warn" and "nixl_pool_size: 0" in f["slots"]["fix"]
    assert f["hicache"]["status"] == "ok" and "min_free_space" in f["hicache"]["fix"]
    for d in ("plugin", "nixl", "meta-llama_Llama-3.1-8B_0123456789ab"):
        assert f[d]["status"] == "ok", f[d]
    # once kvfs has evicted, LMCache's local_disk index may list chunks that are gone: a warning
    for p in (m.mountpoint / "lmcache").iterdir():
        p.read_bytes()  # recently used: other files are evicted first
    free = os.statvfs(m.mountpoint).f_bavail * 4096
    for i in range(free // (2 * MiB)):
        (m.mountpoint / "other" / f"fill{i}").write_bytes(os.urandom(2 * MiB))
    (m.mountpoint / "other" / "last").write_bytes(os.urandom(MiB // 2))  # a little too much
    assert m.stats()["files"]["pool_evictions"] > 0
    f = doctor(m)
    assert f["lmcache"]["status"] == "warn" and "evicted" in f["lmcache"]["detail"]
    assert "(GB, 90% of the pool" in f["lmcache"]["fix"]


def test_doctor_warns_engines_without_eviction_when_kvfs_never_evicts(make_mount, pool_config):
    m = make_mount(pool_config(size="64MiB", pool='evict = "never"'))
    layouts(m.mountpoint)
    f = doctor(m)
    for d in ("nixl", "meta-llama_Llama-3.1-8B_0123456789ab", "lmcache"):
        assert f[d]["status"] == "warn", f[d]
    assert "ENOSPC" in f["lmcache"]["detail"]
    assert f["hicache"]["status"] == "info"
