"""Chains, readahead, pinning and kvfs attributes through a real mount."""

from __future__ import annotations

import json
import os
import subprocess

from tests.helpers import wait_until

MiB = 1 << 20


def attr(path, name) -> str:
    return os.getxattr(path, f"user.kvfs.{name}").decode()


def test_chain_learned_from_write_and_read_order_drives_readahead(make_mount, pool_config):
    m = make_mount(pool_config(dram="128MiB"))
    d = m.mountpoint / "chunks"
    d.mkdir()
    names = [f"model@1@0@{i:04x}@bfloat16.pt" for i in range(12)]
    written = {n: os.urandom(2 * MiB) for n in names}
    for n in names:  # one writer, prefix order
        (d / n).write_bytes(written[n])
    chain = json.loads(attr(d / names[3], "chain"))
    assert chain["parent"].endswith(names[2]) and chain["next"].endswith(names[4])
    m.control("flush")
    m.drop_caches()
    for i, n in enumerate(names):  # one reader, prefix order, cold
        assert (d / n).read_bytes() == written[n]
        if 2 <= i < len(names) - 1:  # once the chain is recognised, the next
            nxt = d / names[i + 1]  # block arrives in DRAM by itself
            wait_until(lambda: attr(nxt, "tier") == "dram", 10, f"{names[i + 1]} prefetched")
    st = m.stats()
    assert st["prefetch"]["issued"] >= 8
    assert st["prefetch"]["predicted_hits"] >= 6
    assert st["prefetch"]["used"] >= 6, st["prefetch"]
    assert st["tiers"]["dram"]["hits"] >= 6  # reads found their block prefetched
    m.restart()  # links persist
    chain = json.loads(attr(d / names[3], "chain"))
    assert chain["next"].endswith(names[4])


def test_pin_through_setfattr_and_getfattr_dump(make_mount, pool_config):
    m = make_mount(pool_config(dram="32MiB"))
    p = m.mountpoint / "keep.pt"
    p.write_bytes(os.urandom(4 * MiB))
    subprocess.run(["setfattr", "-n", "user.kvfs.pin", "-v", "1", str(p)], check=True)
    m.drop_caches()
    assert attr(p, "tier") == "dram"
    for i in range(12):  # pressure on a 32 MiB tier
        (m.mountpoint / f"x{i}").write_bytes(os.urandom(4 * MiB))
    assert attr(p, "tier") == "dram"
    out = subprocess.run(
        ["getfattr", "-d", "-m", "user.kvfs", str(p)], capture_output=True, text=True, check=True
    ).stdout
    for name in ("tier", "layout", "hits", "atime", "chain", "pin"):
        assert f"user.kvfs.{name}=" in out, out
    layout = json.loads(attr(p, "layout"))
    assert layout["size"] == 4 * MiB and layout["generation"] >= 1 and layout["extents"]
    subprocess.run(["setfattr", "-x", "user.kvfs.pin", str(p)], check=True)
    m.drop_caches()
    assert attr(p, "tier") == "pool"
    r = subprocess.run(
        ["setfattr", "-n", "user.kvfs.tier", "-v", "dram", str(p)], capture_output=True, text=True
    )
    assert r.returncode != 0


def test_explicit_chain_hints(make_mount, pool_config):
    m = make_mount(pool_config())
    for n in ("a", "b", "c"):
        (m.mountpoint / n).write_bytes(b"x")
    os.setxattr(m.mountpoint / "a", "user.kvfs.next", b"c")
    os.setxattr(m.mountpoint / "c", "user.kvfs.parent", b"/b")
    assert json.loads(attr(m.mountpoint / "a", "chain"))["next"] == "/c"
    assert json.loads(attr(m.mountpoint / "c", "chain"))["parent"] in ("/a", "/b")
    assert json.loads(attr(m.mountpoint / "b", "chain"))["next"] == "/c"
