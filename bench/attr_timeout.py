#!/usr/bin/env python3
"""Hot loads of names the kernel looked up more than a second ago, with `[mount] attr_timeout`
1 s and 30 s, side by side: what a longer timeout saves (a LOOKUP per open).

8 threads store --files blocks of 256 KiB on kvfs (4 file namespaces), sync, wait 1.5 s (past
the short timeout), then open, read and close every file (resident in DRAM: hot). Reported:
hot loads per second and the FUSE requests of the load phase, per timeout and round.

    python bench/attr_timeout.py [--files 2000] [--rounds 2] [--json]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import dumps  # noqa: E402
from bench.catalog_scale import parallel as per_second  # noqa: E402
from testing.mount import MountedKvfs, write_config  # noqa: E402

BLOCK = 256 << 10
THREADS = 8


def one(timeout: float, n: int) -> dict:
    d = Path(tempfile.mkdtemp(prefix="kvfs-attr-"))
    nss = [{"path": str(d / f"ns{i}.img"), "size": "512MiB"} for i in range(4)]
    cfg = write_config(
        d / "k.toml", d / "state", nss, dram="2GiB", mount=f"attr_timeout = {timeout}"
    )
    m = MountedKvfs(d / "mnt", cfg, d / "log").start()
    data = os.urandom(BLOCK)

    def store(i: int) -> None:
        fd = os.open(m.mountpoint / f"b{i}", os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o644)
        os.write(fd, data)
        os.close(fd)

    def load(i: int) -> None:
        fd = os.open(m.mountpoint / f"b{i}", os.O_RDONLY)
        got = b""
        while chunk := os.read(fd, 1 << 20):
            got += chunk
        os.close(fd)
        if got != data:
            raise RuntimeError(f"b{i}: wrong bytes")

    try:
        per_second(n, THREADS, store)  # a thread's error is raised here, not lost
        m.sync()
        time.sleep(1.5)
        before = m.stats()["latency"]
        rate = per_second(n, THREADS, load)
        after = m.stats()["latency"]
        req = {
            op: (v["count"] - before.get(op, {}).get("count", 0)) / n
            for op, v in after.items()
            if v["count"] != before.get(op, {}).get("count", 0)
        }
        return {"attr_timeout": timeout, "hot_loads_per_s": rate, "requests": req}
    finally:
        m.stop()
        shutil.rmtree(d, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    rows = [one(t, a.files) for _ in range(a.rounds) for t in (1.0, 30.0)]
    rate = {
        t: statistics.median(r["hot_loads_per_s"] for r in rows if r["attr_timeout"] == t)
        for t in (1.0, 30.0)
    }
    out = {
        "files": a.files,
        "rounds": a.rounds,
        "rows": rows,
        "hot_loads_30s_vs_1s": round(rate[30.0] / rate[1.0], 3),
    }
    if a.json:
        print(dumps(out))
    else:
        for r in rows:
            print(
                f"attr_timeout {r['attr_timeout']:>4}: {r['hot_loads_per_s']:8.0f} hot loads/s, "
                f"requests per load {r['requests']}"
            )
        print(f"30 s vs 1 s: {out['hot_loads_30s_vs_1s']}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
