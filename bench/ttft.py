#!/usr/bin/env python3
"""Time to first token with a real engine: vLLM (CPU) + LMCache's multiprocess server whose L2
(its `fs` adapter: one file per 256-token chunk) is a directory on kvfs over 4 loop namespaces,
on ext4 over a RAID-0 of 4 such devices (`raid0`: dm-stripe where the kernel has device-mapper,
else a stand-in, one device at 4x the limit; the JSON's "raid0" says which), or on ext4 over 1
loop device of the same kind and limit; against recomputing the prompt.

Per directory and device speed, every prompt goes through three phases:
  cold       the engine computes the prompt and LMCache stores its KV chunks (the first
             request of a prompt: compute + store). Its time to first token holds no
             storage work: the server writes the chunks after the forward pass that gives
             the first token (measured per process, 2,048 tokens at 200 MB/s: the kvfs
             daemon used 0.07-0.10 s of CPU during a 27-30 s first request, the loop
             devices nothing; the server and the loop devices wrote in the seconds after).
             So its kvfs / ext4 ratio is the engine's compute noise, whatever the file
             system; kvfs's rows give `cold_daemon_cpu_s`, its daemon's CPU meanwhile.
  directory  LMCache's server and the engine restarted, the page cache and kvfs's DRAM tier
             dropped: the prompt's KV is loaded from the directory (the figure kvfs is for)
  DRAM       the same prompt again: from LMCache's own DRAM (L1), for context
and "recompute" is the engine with no connector. The first token must be the same in every
phase, every chunk of the directory phase must come from the directory (the server's log
counts them: a run that loads nothing fails instead of timing a recompute), and the
directory must hold the chunk files after the cold phase.

The model is a Llama of 32 layers x hidden 512 with dummy weights (testing/inference.py):
64 KiB of KV cache per token, a 16 MiB file per chunk, so storage shows against compute on
two cores. Rounds alternate which directory goes first; figures are medians with ranges.
With `--prompts K` each size has K distinct prompts (the same ones in every round and
directory), each through all three phases in turn: medians and ratios are then over rounds x
prompts, and a later prompt's cold phase runs while the server may still be storing the
previous one's chunks, as on a serving engine.

Two things of this 2-core VM, not of storage, would otherwise set the directory phase's time
(found with `perf record -a` over the load; the same for both directories):
  - the server's DRAM is fresh after its restart, and the host backs a fresh page of the VM on
    first touch (1.2 GB/s here against 48 GB/s for memory touched before): the server's
    loader threads spent most of their time zeroing pages. The server's DRAM is given its
    pages once it is up (testing/inference.py `_warm_l1`), as a server running for a while
    has them; its content stays empty.
  - vLLM's engine loop polls without sleeping while a prompt's KV cache loads (a request
    waiting for its KV is work to it) and its front end polls for outputs: 1.1-1.2 cores,
    the CPUs 0% idle, every wake-up of the server and of the file system's threads waiting
    behind them. The engine runs at niceness 19 (`--engine-nice`, every row including
    recompute): it yields the cores to whoever else wants them and computes at full speed
    when nobody does. On the GPU servers kvfs is for, that poll spins on one core of many.
With both (one run, 8k tokens, 200 MB/s per device): the server's load of the 32 chunks took
1.07 s from kvfs (its 4 namespaces need 0.67 s) and 4.8 s from ext4 (its device needs 2.7 s);
without either, 3.0-7.6 s on both and kvfs vs ext4 anywhere from 0.93x to 2.07x.

    python bench/ttft.py [--sizes 2048,8192,16384] [--throttles none,1e9,2e8] [--rounds 1]
                         [--prompts 1] [--json]

Keys of --json: `ttft_<tokens>_<fs>_<speed>` (fs kvfs, raid0 or ext4, the directory phase; speed
`unthrottled` or e.g. `200MBps`), `ttft_<tokens>_recompute`, `cold_<tokens>_<fs>_<speed>`,
`dram_<tokens>_<fs>_<speed>`, and for the largest prompt `ttft_speedup_vs_raid0_<speed>`,
`ttft_speedup_vs_ext4_<speed>`, `ttft_speedup_vs_recompute_<speed>`, `cold_vs_raid0_<speed>`
and `cold_vs_ext4_<speed>` (ext4's cold time over kvfs's:
above 1, kvfs's first request is faster). Needs root, /dev/fuse, loop devices and
`make install-engine`. A round of one prompt size at three speeds takes about 13 minutes here.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import dumps, parse, parser  # noqa: E402
from testing import inference  # noqa: E402
from testing.emulate import (
    Emulation,
    available,
    ext4_on_loop,
    ext4_on_raid0,  # noqa: E402
    kvfs_on_loops,
    throttled,
)
from testing.mount import cpu_seconds  # noqa: E402

MiB = 1 << 20
GiB = 1 << 30


def speed_label(bps: float | None) -> str:
    return "unthrottled" if not bps else f"{bps / 1e6:.0f}MBps"


@contextlib.contextmanager
def directories(tmp: Path, r: int, bps: float | None, data: int):
    """Round `r`'s three directories at one device speed, for `data` bytes of chunks: kvfs over 4
    loop namespaces, ext4 over a RAID-0 of 4 (testing/emulate.py's ext4_on_raid0: dm-stripe, or
    its stand-in) and ext4 over 1, on devices of their own (a loop device's file keeps every
    page written to it); [(fs, set-up)] in the round's order (rounds alternate it)."""
    speed = speed_label(bps)
    with (
        Emulation(f"{(3 * data + 3 * GiB) // MiB}m") as emu,
        ext4_on_loop(emu, tmp, f"ext4-{r}-{speed}", data + 512 * MiB, bps) as on_ext4,
        ext4_on_raid0(emu, tmp, f"raid0-{r}-{speed}", 4, data + 512 * MiB, bps) as on_raid0,
        kvfs_on_loops(
            emu, tmp, f"kvfs-{r}-{speed}", 4, data + 512 * MiB, bps, dram="1GiB"
        ) as on_kvfs,
    ):
        order = [("kvfs", on_kvfs), ("raid0", on_raid0), ("ext4", on_ext4)]
        yield order if r % 2 == 0 else order[::-1]


def phases(
    setup,
    fs: str,
    model: Path,
    prompts: dict[tuple[int, int], list[int]],
    logs: Path,
    l1_gb: float,
    kv_gib: int,
    max_tokens: int,
    adapter: dict,
    nice: int,
) -> dict:
    """The three phases of every prompt (keyed by (tokens, prompt number)) on one directory;
    {key: {cold, directory, dram, first, load_ms}}."""
    d = setup.root / "lmcache"
    d.mkdir()
    out: dict = {key: {} for key in prompts}
    chunks = {key: key[0] // inference.CHUNK_TOKENS for key in prompts}

    def run(phase_names: tuple[str, ...]) -> None:
        with (
            inference.LMCacheServer(
                d, logs / f"server-{fs}.log", l1_gb=l1_gb, adapter=adapter
            ) as server,
            throttled(setup, server.proc.pid),
            inference.Engine(
                model,
                logs / f"engine-{fs}.log",
                port=server.port,
                kv_cache_gib=kv_gib,
                max_tokens=max_tokens,
                nice=nice,
            ) as engine,
        ):
            for key, ids in prompts.items():
                n = key[0]
                for phase in phase_names:
                    before = len(server.loads())
                    cpu0 = cpu_seconds(setup.kvfs.pid) if setup.kvfs is not None else None
                    seconds, first = engine.ttft(ids)
                    out[key][phase] = seconds
                    if cpu0 is not None:  # what the file system's daemon did meanwhile
                        out[key][f"{phase}_daemon_cpu_s"] = cpu_seconds(setup.kvfs.pid) - cpu0
                    if out[key].setdefault("first", first) != first:
                        raise SystemExit(
                            f"bench/ttft.py: {fs}, {n} tokens: first token {first} "
                            f"in the {phase} phase, {out[key]['first']} before"
                        )
                    if phase == "directory":
                        got = server.loads()[before:]
                        l2 = sum(x["l2"] for x in got)
                        if l2 < chunks[key]:
                            raise SystemExit(
                                f"bench/ttft.py: {fs}, {n} tokens: {l2} of {chunks[key]} chunks "
                                f"loaded from the directory (server log: {got}); nothing to time"
                            )
                        out[key]["load_ms"] = sum(x["ms"] for x in got)

    run(("cold",))
    files = [f for f in d.iterdir() if f.is_file()]
    if len(files) < sum(chunks.values()):
        raise SystemExit(
            f"bench/ttft.py: {fs}: {len(files)} chunk files after the cold phase, "
            f"{sum(chunks.values())} expected (is LMCache storing anything?)"
        )
    out["stored_bytes"] = sum(f.stat().st_size for f in files)
    setup.sync()
    setup.drop()  # the page cache (and kvfs's DRAM tier)
    before = setup.kvfs.stats()["prefetch"] if setup.kvfs is not None else None
    run(("directory", "dram"))
    if before is not None:  # kvfs's readahead along the chunks' chain while loading
        after = setup.kvfs.stats()["prefetch"]
        out["prefetch"] = {k: after[k] - before[k] for k in ("issued", "used", "wasted")}
    shutil.rmtree(d)
    setup.sync()
    return out


def recompute(
    model: Path,
    prompts: dict[tuple[int, int], list[int]],
    logs: Path,
    kv_gib: int,
    max_tokens: int,
    firsts: dict,
    nice: int,
) -> dict[tuple[int, int], float]:
    out = {}
    with inference.Engine(
        model, logs / "engine-recompute.log", kv_cache_gib=kv_gib, max_tokens=max_tokens, nice=nice
    ) as engine:
        for key, ids in prompts.items():
            out[key], first = engine.ttft(ids)
            if key in firsts and firsts[key] != first:
                raise SystemExit(
                    f"bench/ttft.py: recompute of {key[0]} tokens gave first token "
                    f"{first}, the directories {firsts[key]}"
                )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--sizes", default="2048,8192,16384", help="prompt lengths in tokens")
    ap.add_argument(
        "--throttles",
        default="none,1e9,2e8",
        help="bytes/s per device (read and write), 'none' for unthrottled",
    )
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument(
        "--prompts",
        type=int,
        default=1,
        help="distinct prompts of each size (medians over rounds x prompts)",
    )
    ap.add_argument(
        "--adapter",
        default='{"type": "fs"}',
        help="LMCache's L2 adapter as JSON, without base_path (e.g. "
        '\'{"type": "fs_native", "num_workers": 8}\')',
    )
    ap.add_argument(
        "--engine-nice", type=int, default=19, help="the engine's niceness (0: none; see above)"
    )
    ap.add_argument("--logs", help="keep the servers' and engines' logs here")
    args = parse(ap, argv, lambda a: available() or inference.available())
    sizes = sorted(int(s) for s in args.sizes.split(","))
    if any(n % inference.CHUNK_TOKENS for n in sizes):
        ap.error(f"prompt lengths are multiples of {inference.CHUNK_TOKENS} tokens")
    throttles = [None if t == "none" else float(t) for t in args.throttles.split(",")]
    adapter = json.loads(args.adapter)
    started = time.monotonic()
    rows: list[dict] = []
    raid0_kind = None
    with tempfile.TemporaryDirectory(prefix="kvfs-ttft-") as tmp:
        tmp = Path(tmp)
        logs = Path(args.logs) if args.logs else tmp / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        model = inference.write_model(tmp / "model")
        per_token = inference.kv_bytes_per_token(model)
        data = sum(sizes) * per_token * args.prompts
        l1_gb = round(data / GiB + 0.5, 1)
        kv_gib = max(1, -(-max(sizes) * per_token // GiB) + 1)
        max_tokens = max(sizes) + 64
        # prompt 0 of each size is the one earlier versions of this bench used (seed = size)
        prompts = {
            (n, p): inference.prompt(n, seed=n + 7919 * p)
            for n in sizes
            for p in range(args.prompts)
        }
        for r in range(args.rounds):
            firsts: dict[tuple[int, int], int] = {}
            for bps in throttles:
                speed = speed_label(bps)
                with directories(tmp, r, bps, data) as order:
                    for fs, setup in order:
                        if setup.raid0:
                            raid0_kind = setup.raid0
                        # the set-up's syncs from this process meet its limit (ext4's
                        # set-ups each have a group; a process is in one at a time)
                        with (
                            throttled(setup, os.getpid())
                            if setup.kvfs is None
                            else contextlib.nullcontext()
                        ):
                            got = phases(
                                setup,
                                fs,
                                model,
                                prompts,
                                logs,
                                l1_gb,
                                kv_gib,
                                max_tokens,
                                adapter,
                                args.engine_nice,
                            )
                        for key in prompts:
                            n, p = key
                            g = got[key]
                            if firsts.setdefault(key, g["first"]) != g["first"]:
                                raise SystemExit(
                                    f"bench/ttft.py: {n} tokens: first token "
                                    f"{g['first']} on {fs}, {firsts[key]} before"
                                )
                            rows.append(
                                {
                                    "round": r,
                                    "fs": fs,
                                    "speed": speed,
                                    "tokens": n,
                                    "prompt": p,
                                    **{
                                        k: g[k]
                                        for k in ("cold", "directory", "dram", "load_ms", "first")
                                    },
                                    **{
                                        k: g[k]
                                        for k in ("cold_daemon_cpu_s", "directory_daemon_cpu_s")
                                        if k in g
                                    },
                                    **({"prefetch": got["prefetch"]} if "prefetch" in got else {}),
                                }
                            )
                        print(
                            f"round {r} {speed:>11} {fs}: "
                            + ", ".join(
                                f"{n}#{p}: {got[n, p]['directory']:.2f} s" for n, p in prompts
                            ),
                            file=sys.stderr,
                            flush=True,
                        )
            for (n, p), s in recompute(
                model, prompts, logs, kv_gib, max_tokens, firsts, args.engine_nice
            ).items():
                rows.append(
                    {
                        "round": r,
                        "fs": "recompute",
                        "speed": "-",
                        "tokens": n,
                        "prompt": p,
                        "directory": s,
                    }
                )
    out = summarize(rows, sizes, [speed_label(b) for b in throttles])
    out["minutes"] = round((time.monotonic() - started) / 60, 1)
    out["raid0"] = raid0_kind
    out["rounds"] = args.rounds
    out["prompts"] = args.prompts
    out["adapter"] = adapter
    out["engine_nice"] = args.engine_nice
    print_table(out, sizes, [speed_label(b) for b in throttles])
    if args.json:
        print(dumps(out))
    return 0


def _median(xs: list[float]) -> tuple[float, float, float]:
    return statistics.median(xs), min(xs), max(xs)


def summarize(rows: list[dict], sizes: list[int], speeds: list[str]) -> dict:
    out: dict = {
        "rows": [
            {k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()} for r in rows
        ]
    }
    # every row by (round and prompt, fs, speed, tokens); recompute's rows have the speed "-"
    # (rows of earlier versions, one prompt per size, have no "prompt": it was prompt 0)
    by = {((r["round"], r.get("prompt", 0)), r["fs"], r["speed"], r["tokens"]): r for r in rows}
    rounds = sorted({k[0] for k in by})

    def median_of(fs, speed, n, key):
        xs = [by[r, fs, speed, n][key] for r in rounds if (r, fs, speed, n) in by]
        return round(_median(xs)[0], 3) if xs else None

    for n in sizes:
        out[f"ttft_{n}_recompute"] = median_of("recompute", "-", n, "directory")
        for speed in speeds:
            for fs in ("kvfs", "raid0", "ext4"):
                for key, name in (("directory", "ttft"), ("cold", "cold"), ("dram", "dram")):
                    v = median_of(fs, speed, n, key)
                    if v is not None:  # (rows of earlier versions have no raid0)
                        out[f"{name}_{n}_{fs}_{speed}"] = v
    big = max(sizes)
    for speed in speeds:
        # per round and prompt: the baseline's time over kvfs's (above 1: kvfs is faster)
        for name, base, base_speed, key in (
            (f"ttft_speedup_vs_raid0_{speed}", "raid0", speed, "directory"),
            (f"ttft_speedup_vs_ext4_{speed}", "ext4", speed, "directory"),
            (f"ttft_speedup_vs_recompute_{speed}", "recompute", "-", "directory"),
            (f"cold_vs_raid0_{speed}", "raid0", speed, "cold"),
            (f"cold_vs_ext4_{speed}", "ext4", speed, "cold"),
        ):
            xs = [
                by[r, base, base_speed, big]["directory" if base == "recompute" else key]
                / by[r, "kvfs", speed, big][key]
                for r in rounds
                if (r, base, base_speed, big) in by and (r, "kvfs", speed, big) in by
            ]
            if xs:
                med, lo, hi = _median(xs)
                out[name] = round(med, 2)
                out[name + "_range"] = [round(lo, 2), round(hi, 2)]
    return out


def print_table(out: dict, sizes: list[int], speeds: list[str]) -> None:
    print(
        f"TTFT in seconds, median of {out['rounds']} round(s) x {out.get('prompts', 1)} "
        f"prompt(s) of each size ({out['minutes']} min); "
        "directory: served from the chunk files after both processes restarted and the "
        "caches dropped; cold: compute + store; DRAM: from LMCache's memory"
    )
    print(
        f"{'devices':>12} {'tokens':>7} {'recompute':>10} {'kvfs dir':>9} {'raid0 dir':>10} "
        f"{'ext4 dir':>9} {'kvfs cold':>10} {'raid0 cold':>11} {'ext4 cold':>10} "
        f"{'kvfs DRAM':>10} {'ext4 DRAM':>10}"
    )
    for speed in speeds:
        for n in sizes:
            g = lambda k: out.get(k) or float("nan")  # noqa: E731
            print(
                f"{speed:>12} {n:>7} {g(f'ttft_{n}_recompute'):>10.2f} "
                f"{g(f'ttft_{n}_kvfs_{speed}'):>9.2f} {g(f'ttft_{n}_raid0_{speed}'):>10.2f} "
                f"{g(f'ttft_{n}_ext4_{speed}'):>9.2f} "
                f"{g(f'cold_{n}_kvfs_{speed}'):>10.2f} {g(f'cold_{n}_raid0_{speed}'):>11.2f} "
                f"{g(f'cold_{n}_ext4_{speed}'):>10.2f} "
                f"{g(f'dram_{n}_kvfs_{speed}'):>10.2f} {g(f'dram_{n}_ext4_{speed}'):>10.2f}"
            )
    print(f"largest prompt ({max(sizes)} tokens), kvfs's speed-up (median [range]):")
    for speed in speeds:
        for key in (
            f"ttft_speedup_vs_raid0_{speed}",
            f"ttft_speedup_vs_ext4_{speed}",
            f"ttft_speedup_vs_recompute_{speed}",
            f"cold_vs_raid0_{speed}",
            f"cold_vs_ext4_{speed}",
        ):
            if key in out:
                print(f"  {key:<40} {out[key]:>6} {out[key + '_range']}")


if __name__ == "__main__":
    raise SystemExit(main())
