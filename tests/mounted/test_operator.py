"""The operator's view: the kvfs CLI, getfattr/setfattr, kvfs top in a real terminal, metrics."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request

import pytest

from testing.redis_server import free_port
from tests.helpers import ROOT

MiB = 1 << 20


def kvfs(*args: str, user: int | None = None, check: bool = True) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "kvfs", *args]
    if user is not None:
        cmd = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *cmd]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120)
    if check:
        assert r.returncode == 0, r.stderr
    return r


def js(*args: str) -> object:
    return json.loads(kvfs(*args, "--json").stdout)


@pytest.fixture
def chain_mount(make_mount, pool_config):
    m = make_mount(pool_config(dram="64MiB"))
    d = m.mountpoint / "model"
    d.mkdir()
    for i in range(4):  # one writer, in prefix order
        (d / f"chunk{i}.pt").write_bytes(os.urandom(2 * MiB))
    (d / "other.pt").write_bytes(b"x" * 4096)
    return m


def test_stat_counts_hits_and_shows_layout(chain_mount):
    f = chain_mount.mountpoint / "model" / "chunk1.pt"
    chain_mount.drop_caches()
    f.read_bytes()
    f.read_bytes()
    a = js("stat", str(f))
    assert a["hits"] == 2 and a["tier"] == "dram" and a["size"] == 2 * MiB
    assert a["layout"]["size"] == 2 * MiB and a["layout"]["stripe_unit"] == MiB
    assert a["chain"]["parent"].endswith("chunk0.pt") and a["chain"]["next"].endswith("chunk2.pt")
    human = kvfs("stat", str(f)).stdout
    assert "Tier: dram" in human and "Hits: 2" in human


def test_pin_evict_warm_and_tiers(chain_mount):
    d = chain_mount.mountpoint / "model"
    chain_mount.drop_caches()
    assert js("pin", str(d / "chunk0.pt"))[0]["tier"] == "dram"
    chain_mount.drop_caches()
    assert js("stat", str(d / "chunk0.pt"))["tier"] == "dram"
    r = kvfs("evict", str(d / "chunk0.pt"), check=False)
    assert r.returncode == 1 and "pinned" in r.stderr and "unpin" in r.stderr
    kvfs("unpin", str(d / "chunk0.pt"))
    ev = js("evict", str(d / "chunk0.pt"))
    assert ev["evicted"] == ["/model/chunk0.pt"]
    assert js("stat", str(d / "chunk0.pt"))["tier"] == "pool"
    w = js("warm", str(d / "chunk0.pt"), "--depth", "3")
    assert w["resident"] == w["total"] == 4  # the whole chain is in DRAM
    assert all(b["tier"] == "dram" for b in w["blocks"])
    cold = js("evict", "--cold", "2", "--mount", str(chain_mount.mountpoint))
    assert len(cold["evicted"]) == 2
    listing = js("ls", "-l", str(d))
    tiers = {i["name"]: i["tier"] for i in listing}
    assert sorted(tiers.values()).count("pool") >= 2 and set(tiers) >= {"chunk0.pt", "other.pt"}


def test_tree_df_du(chain_mount):
    d = chain_mount.mountpoint / "model"
    tree = js("tree", str(d))
    roots = {t["name"]: t for t in tree}
    node, depth = roots["chunk0.pt"], 1
    while node["next"]:
        node, depth = node["next"][0], depth + 1
    assert depth >= 4  # chunk0 -> chunk1 -> chunk2 -> chunk3
    text = kvfs("tree", str(d)).stdout
    assert "chunk0.pt" in text and "↳ chunk1.pt" in text
    df = js("df", str(chain_mount.mountpoint))
    st = chain_mount.stats()
    assert df["tiers"]["pool"]["capacity"] == st["tiers"]["pool"]["capacity"]
    assert df["tiers"]["dram"]["capacity"] == 64 * MiB
    du = js("du", str(d))
    assert du["total"]["files"] == 5 and du["total"]["bytes"] == 4 * 2 * MiB + 4096


def test_errors_name_the_problem(chain_mount, tmp_path):
    r = kvfs("stat", str(tmp_path), check=False)
    assert r.returncode == 1 and r.stderr.strip() == f"kvfs: not a kvfs mount: {tmp_path}"
    r = kvfs("stat", str(chain_mount.mountpoint / "nope"), check=False)
    assert r.returncode == 1 and "no such file or directory" in r.stderr
    r = kvfs("evict", check=False)
    assert r.returncode == 2
    ctl = chain_mount.mountpoint / ".kvfs-control"
    with pytest.raises(OSError):
        os.setxattr(ctl, "user.kvfs.explode", b"{}")
    res = json.loads(os.getxattr(ctl, "user.kvfs.result"))
    assert res["ok"] is False and "unknown action" in res["error"]
    with pytest.raises(OSError):
        os.setxattr(ctl, "user.kvfs.set", b'{"prefetch.max_window": 0}')
    assert "max_window takes 1 to 256" in json.loads(os.getxattr(ctl, "user.kvfs.result"))["error"]
    assert (
        chain_mount.control("set", {"prefetch.max_window": 4})["result"]["prefetch.max_window"] == 4
    )
    os.chmod(chain_mount.mountpoint, 0o755)
    os.chmod(chain_mount.mountpoint.parent, 0o755)
    r = kvfs(
        "evict", "--cold", "1", "--mount", str(chain_mount.mountpoint), user=65534, check=False
    )
    assert r.returncode == 1 and "owner or root" in r.stderr


def test_doctor(chain_mount):
    r = kvfs("doctor", str(chain_mount.mountpoint), "--json")
    report = json.loads(r.stdout)
    assert report["ok"] is True
    checks = {f["check"] for f in report["findings"]}
    assert {"fuse", "mount", "namespace", "rdma", "kvikio", "numa", "data path"} <= checks
    path = [f for f in report["findings"] if f["check"] == "data path"][0]
    assert (path["status"] == "ok") == chain_mount.passthrough  # says which, and why
    assert "passthrough" in path["detail"] and "block memory" in path["detail"]
    rdma = [f for f in report["findings"] if f["check"] == "rdma"]
    assert rdma and all(f["status"] in ("info", "ok") for f in rdma)  # none here: said, not failed
    chain_mount.proc.kill()  # a dead daemon
    chain_mount.proc.wait()
    r = kvfs("doctor", str(chain_mount.mountpoint), check=False)
    assert r.returncode == 1 and "FAIL" in r.stdout and "umount" in r.stdout
    chain_mount.kill()


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_top_in_a_real_terminal(chain_mount):
    session = f"kvfs-top-{os.getpid()}"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = f"{sys.executable} -m kvfs top {chain_mount.mountpoint} --interval 0.3"
    subprocess.run(
        ["tmux", "new-session", "-d", "-s", session, "-x", "200", "-y", "50", cmd],
        check=True,
        env=env,
    )
    try:
        d = chain_mount.mountpoint / "model"
        deadline = time.monotonic() + 30
        pane = ""
        while time.monotonic() < deadline:
            chain_mount.drop_caches()
            for i in range(4):
                (d / f"chunk{i}.pt").read_bytes()
            pane = subprocess.run(
                ["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True
            ).stdout
            if (
                "dram" in pane
                and "MB/s" in pane
                and "ACCURACY" in pane.upper()
                and any(
                    line.startswith("pool") and " 0.0 " not in line.split("MiB")[-1][:12]
                    for line in pane.splitlines()
                )
            ):
                break
            time.sleep(0.3)
        assert "kvfs top - " + str(chain_mount.mountpoint) in pane, pane
        assert "TIER" in pane and "NS" in pane and "PREFETCH" in pane and "LATENCY" in pane
        assert "READS" in pane  # each namespace's read state (issue 58: failed for reads)
        dram = [ln for ln in pane.splitlines() if ln.startswith("dram")][0]
        assert "64.0 MiB" in dram  # the configured capacity
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)


def test_prometheus_metrics(make_mount, pool_config):
    port = free_port()
    m = make_mount(pool_config(extra=f"metrics_port = {port}\n"))
    (m.mountpoint / "f").write_bytes(b"x" * 10000)
    (m.mountpoint / "f").read_bytes()
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    assert 'kvfs_tier_capacity_bytes{tier="dram"} 67108864.0' in body
    assert "kvfs_namespace_up{" in body and 'kvfs_requests_total{op="open"}' in body
    # reads reach the daemon only without FUSE passthrough (the kernel serves them otherwise)
    op = "passthrough_opens" if m.passthrough else "plain_opens"
    assert float(body.split(f"\nkvfs_{op}_total ")[1].split()[0]) == 2  # create, open
    assert ('kvfs_requests_total{op="read"}' in body) != m.passthrough


def test_shell_tools_need_only_getfattr(chain_mount, tmp_path):
    d = chain_mount.mountpoint / "model"
    r = subprocess.run(
        [str(ROOT / "tools" / "kvfs-tiers"), str(d / "chunk0.pt"), str(d / "other.pt")],
        capture_output=True,
        text=True,
        check=True,
    )
    # ("write-buffer": closed, still waiting for write-back in "fsync" mode)
    assert len(r.stdout.splitlines()) == 2
    assert r.stdout.split()[0] in ("dram", "pool", "write-buffer")
    chain_mount.sync()
    r = subprocess.run(
        [str(ROOT / "tools" / "kvfs-tiers"), str(d / "chunk0.pt")],
        capture_output=True,
        text=True,
        check=True,
    )
    assert r.stdout.split()[0] == "dram"
    r = subprocess.run(
        [str(ROOT / "tools" / "kvfs-tiers"), str(tmp_path)], capture_output=True, text=True
    )
    assert r.returncode == 1 and "not a file on a kvfs mount" in r.stderr
    r = subprocess.run(
        [str(ROOT / "tools" / "kvfs-stats"), str(chain_mount.mountpoint)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(r.stdout)["version"] == 1


def test_actions_run_side_by_side_each_read_back_their_own_outcome(make_mount, pool_config):
    """An action's outcome (`user.kvfs.result`) is kept per calling thread: a script's
    `drop_dram` in one thread never hands its result to `kvfs pool` or `kvfs evict` running
    in another (it once did: outcomes were kept per uid)."""
    import threading

    from kvfs.cli.common import control

    m = make_mount(pool_config())
    (m.mountpoint / "f").write_bytes(os.urandom(1 << 20))
    stop = threading.Event()
    wrong: list = []

    def other() -> None:
        while not stop.is_set():
            got = control(str(m.mountpoint), "drop_dram")
            if set(got) != {"bytes_dropped"}:
                wrong.append(got)

    th = threading.Thread(target=other)
    th.start()
    try:
        for _ in range(200):
            got = control(str(m.mountpoint), "evict", {"cold": 1})
            if "bytes_dropped" in got:
                wrong.append(got)
    finally:
        stop.set()
        th.join()
    assert wrong == []
