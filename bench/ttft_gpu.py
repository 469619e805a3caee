#!/usr/bin/env python3
"""Time to first token on a GPU: vLLM with LMCache's in-process connector (LMCacheConnectorV1)
and its `local_disk` backend in a directory on kvfs over 4 loop namespaces, or on ext4 over one
loop device of the same kind and limit; against recomputing the prompt. The configuration the
README recommends, on the machines kvfs is for. One script: run it as root on a GPU server.

It needs what this project's machines do not have: a GPU with vLLM (CUDA) and LMCache in the
interpreter given by --python (e.g. `pip install vllm lmcache` in a venv), besides this repo's
`make install` (kvfs, root, /dev/fuse, loop devices). The GPU machine lent to the project's
sessions cannot fetch packages and carries at most 64 MiB, where vLLM's CUDA wheel alone is
several hundred, so it has not run there. On a CPU, LMCache's in-process connector has no
path ("No supported cpu connector found ... degraded mode (recompute)") and stores nothing:
the script then stops at its first check and says so (bench/ttft.py is the CPU bench, with
LMCache's multiprocess server).

The model has Llama-3.1-8B's shape with dummy weights (no download; prompts given as token
ids): 128 KiB of KV cache per token, a 32 MiB file per 256-token chunk. Per directory and
device speed, each prompt size goes through:
  cold       prompt A computed, its KV stored by LMCache (compute + store); the run waits
             until the directory holds A's chunk files (LMCache writes them behind)
  (flush)    prompt B of the same size computed and stored: LMCache's CPU tier holds about
             one prompt's KV, so A's chunks leave it (local_disk keeps its index in the
             engine's memory, so the engine is not restarted, as bench/ttft.py restarts its
             server: it would forget A's files)
  directory  the page cache and kvfs's DRAM tier dropped, A again: its KV loaded from the
             directory (LMCache's log must say it retrieved all of A's chunks, or the run
             fails instead of timing a recompute)
  DRAM       A once more, from LMCache's CPU tier
and "recompute" is vLLM with no connector. The first token must be the same in every phase.

    python bench/ttft_gpu.py [--python /path/to/venv/bin/python] [--sizes 8192,32768]
                             [--throttles none,1e9] [--rounds 3] [--model 8b|small] [--json]

Keys of --json as bench/ttft.py's (`ttft_<tokens>_<fs>_<speed>`, `ttft_speedup_vs_ext4_<speed>`,
`ttft_speedup_vs_recompute_<speed>`, `cold_vs_ext4_<speed>` for the largest prompt).
"""

from __future__ import annotations

import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import dumps, parse, parser  # noqa: E402
from bench.ttft import directories, print_table, speed_label, summarize
from testing import inference

GiB = 1 << 30
# "[req_id=...] Retrieved 8192 out of 8192 required tokens (from 8192 total tokens). ..."
RETRIEVED = re.compile(r"Retrieved (\d+) out of (\d+) required tokens")


def lmcache_config(path: Path, directory: Path, cpu_gb: float, disk_gb: float) -> Path:
    """LMCache's in-process configuration, as the README gives it, with the CPU tier `cpu_gb`."""
    path.write_text(
        "chunk_size: 256\n"
        "local_cpu: true\n"
        f"max_local_cpu_size: {cpu_gb}\n"
        f'local_disk: "file://{directory}/"\n'
        f"max_local_disk_size: {disk_gb}\n"
        "extra_config:\n"
        "  use_odirect: true\n"
    )
    return path


DEGRADED = "degraded mode (recompute)"  # LMCache without a GPU connector: stores nothing


def wait_for_files(d: Path, count: int, log: Path, timeout: float = 120) -> int:
    """Wait until the directory holds `count` files (LMCache stores behind the request), or
    until the engine's log says LMCache will store nothing."""
    deadline = time.monotonic() + timeout
    while True:
        n = sum(1 for f in d.iterdir() if f.is_file())
        if n >= count or time.monotonic() > deadline or DEGRADED in log.read_text(errors="replace"):
            return n
        time.sleep(0.2)


def phases(
    setup,
    fs: str,
    model: Path,
    sizes: list[int],
    logs: Path,
    python: Path,
    per_token: int,
    max_tokens: int,
) -> dict:
    d = setup.root / "lmcache"
    d.mkdir()
    out: dict = {}
    for n in sizes:
        a, b = inference.prompt(n, seed=n), inference.prompt(n, seed=n + 1)
        chunks = n // inference.CHUNK_TOKENS
        cfg = lmcache_config(
            logs / f"lmcache-{fs}-{n}.yaml",
            d,
            cpu_gb=round(1.2 * n * per_token / GiB, 2),
            disk_gb=round(4 * n * per_token / GiB + 1, 1),
        )
        log = logs / f"engine-{fs}-{n}.log"
        with inference.Engine(
            model,
            log,
            max_tokens=max_tokens,
            python=python,
            connector={"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"},
            env={"LMCACHE_CONFIG_FILE": str(cfg)},
        ) as engine:
            row: dict = {}
            row["cold"], row["first"] = engine.ttft(a)
            stored = wait_for_files(d, chunks, log)
            if stored < chunks:
                raise SystemExit(
                    f"bench/ttft_gpu.py: {fs}, {n} tokens: {stored} chunk files after the cold "
                    f"phase, {chunks} expected: LMCache stored nothing (no GPU? its in-process "
                    f"connector then runs degraded: recompute). Log: {log}"
                )
            engine.ttft(b)
            wait_for_files(d, 2 * chunks, log)
            setup.sync()
            setup.drop()
            seen = len(RETRIEVED.findall(log.read_text(errors="replace")))
            row["directory"], first = engine.ttft(a)
            got = RETRIEVED.findall(log.read_text(errors="replace"))[seen:]
            loaded = sum(int(x[0]) for x in got)
            if loaded < chunks * inference.CHUNK_TOKENS:
                raise SystemExit(
                    f"bench/ttft_gpu.py: {fs}, {n} tokens: LMCache retrieved "
                    f"{loaded} tokens of {n}; nothing to time. Log: {log}"
                )
            row["dram"], first2 = engine.ttft(a)
            if not row["first"] == first == first2:
                raise SystemExit(
                    f"bench/ttft_gpu.py: {fs}, {n} tokens: first tokens "
                    f"{row['first']}, {first}, {first2} in the three phases"
                )
            out[n] = row
        shutil.rmtree(d)
        d.mkdir()
        setup.sync()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__)
    ap.add_argument(
        "--python",
        default=str(
            inference.ENGINE_PYTHON if inference.ENGINE_PYTHON.exists() else sys.executable
        ),
        help="an interpreter with vLLM (CUDA) and LMCache",
    )
    ap.add_argument("--sizes", default="8192,32768", help="prompt lengths in tokens")
    ap.add_argument(
        "--throttles", default="none,1e9", help="bytes/s per device, 'none' for unthrottled"
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--model",
        choices=("8b", "small"),
        default="8b",
        help="8b: Llama-3.1-8B's shape; small: bench/ttft.py's (a check on a CPU)",
    )
    ap.add_argument("--logs", help="keep the engines' logs and LMCache's configs here")
    args = parse(ap, argv)
    sizes = sorted(int(s) for s in args.sizes.split(","))
    if any(n % inference.CHUNK_TOKENS for n in sizes):
        ap.error(f"prompt lengths are multiples of {inference.CHUNK_TOKENS} tokens")
    throttles = [None if t == "none" else float(t) for t in args.throttles.split(",")]
    started = time.monotonic()
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="kvfs-ttft-gpu-") as tmp:
        tmp = Path(tmp)
        logs = Path(args.logs) if args.logs else tmp / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        model = inference.write_model(
            tmp / "model", **(inference.LLAMA_8B if args.model == "8b" else {})
        )
        per_token = inference.kv_bytes_per_token(model)
        data = 2 * max(sizes) * per_token  # prompts A and B of the largest size
        max_tokens = max(sizes) + 64
        firsts: dict[int, int] = {}  # the first token of each prompt: the same everywhere
        for r in range(args.rounds):
            for bps in throttles:
                speed = speed_label(bps)
                with directories(tmp, r, bps, data) as order:
                    for fs, setup in order:
                        got = phases(
                            setup, fs, model, sizes, logs, Path(args.python), per_token, max_tokens
                        )
                        for n in sizes:
                            if firsts.setdefault(n, got[n]["first"]) != got[n]["first"]:
                                raise SystemExit(
                                    f"bench/ttft_gpu.py: {n} tokens: first token "
                                    f"{got[n]['first']} on {fs}, {firsts[n]} before"
                                )
                            rows.append(
                                {
                                    "round": r,
                                    "fs": fs,
                                    "speed": speed,
                                    "tokens": n,
                                    **{
                                        k: got[n][k] for k in ("cold", "directory", "dram", "first")
                                    },
                                }
                            )
                        print(
                            f"round {r} {speed:>11} {fs}: "
                            + ", ".join(f"{n}: {got[n]['directory']:.2f} s" for n in sizes),
                            file=sys.stderr,
                            flush=True,
                        )
            with inference.Engine(
                model,
                logs / "engine-recompute.log",
                max_tokens=max_tokens,
                python=Path(args.python),
            ) as engine:
                for n in sizes:
                    seconds, first = engine.ttft(inference.prompt(n, seed=n))
                    if n in firsts and firsts[n] != first:
                        raise SystemExit(
                            f"bench/ttft_gpu.py: recompute of {n} tokens gave "
                            f"first token {first}, the directories {firsts[n]}"
                        )
                    rows.append(
                        {
                            "round": r,
                            "fs": "recompute",
                            "speed": "-",
                            "tokens": n,
                            "directory": seconds,
                        }
                    )
    out = summarize(rows, sizes, [speed_label(b) for b in throttles])
    out["minutes"] = round((time.monotonic() - started) / 60, 1)
    out["rounds"] = args.rounds
    out["connector"] = "LMCacheConnectorV1 + local_disk"
    print_table(out, sizes, [speed_label(b) for b in throttles])
    if args.json:
        print(dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
