"""A real inference engine on the CPU whose KV cache lives in a directory: vLLM runs a model and
LMCache's multiprocess server stores and loads its KV chunks as files (its `fs` L2 adapter), as
an inference node would with the directory on kvfs. For bench/ttft.py and tests/engine/.

Both run from `.venv-engine` (`make install-engine`: a layer over `.venv` with what vLLM needs
to run a model). The model needs no download: a Llama `config.json` with dummy weights (seeded,
so every process computes the same tokens), prompts given as token ids.

    model = write_model(tmp / "model")
    with LMCacheServer(directory, tmp / "server.log") as server, \\
            Engine(model, tmp / "engine.log", port=server.port) as engine:
        seconds, first_token = engine.ttft(prompt(8192, seed=1))
    server.loads()        # per request: (chunks from LMCache's DRAM, chunks from the directory)

What LMCache's in-process connector cannot do here: it has no CPU path (it logs "No supported
cpu connector found" and recomputes, storing nothing), so the multiprocess server is what runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from testing.mount import log_tail
from testing.redis_server import free_port

ROOT = Path(__file__).resolve().parents[1]
ENGINE_PYTHON = ROOT / ".venv-engine" / "bin" / "python"
CHUNK_TOKENS = 256  # LMCache's chunk: one file per 256 tokens of a prompt


def available() -> str | None:
    """None, or why a real engine cannot run here."""
    if not ENGINE_PYTHON.exists():
        return (
            f"needs vLLM and LMCache's server in {ENGINE_PYTHON.parent.parent} "
            "(make install-engine)"
        )
    return None


def write_model(
    path: Path,
    layers: int = 32,
    hidden: int = 512,
    heads: int = 8,
    vocab: int = 32000,
    kv_heads: int | None = None,
    intermediate: int | None = None,
) -> Path:
    """A Llama of `layers` x `hidden` with dummy weights: 2 x layers x kv_heads x head_dim x 2
    bytes of KV cache per token (64 KiB for the default: a 256-token chunk is a 16 MiB file;
    Llama-3.1-8B's shape, `LLAMA_8B`, has 128 KiB: 32 MiB chunks)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "hidden_size": hidden,
                "intermediate_size": intermediate or 2 * hidden,
                "num_hidden_layers": layers,
                "num_attention_heads": heads,
                "num_key_value_heads": kv_heads or heads,
                "head_dim": hidden // heads,
                "vocab_size": vocab,
                "max_position_embeddings": 32768,
                "rms_norm_eps": 1e-5,
                "rope_theta": 500000.0,
                "torch_dtype": "bfloat16",
                "bos_token_id": 1,
                "eos_token_id": 2,
                "tie_word_embeddings": False,
            }
        )
    )
    return path


# Llama-3.1-8B's shape (dummy weights: nothing to download), for a GPU
LLAMA_8B = {
    "layers": 32,
    "hidden": 4096,
    "heads": 32,
    "kv_heads": 8,
    "intermediate": 14336,
    "vocab": 128256,
}


def kv_bytes_per_token(model: Path) -> int:
    c = json.loads((model / "config.json").read_text())
    return 2 * c["num_hidden_layers"] * c["num_key_value_heads"] * c["head_dim"] * 2


def prompt(tokens: int, seed: int) -> list[int]:
    """`tokens` token ids, the same for the same seed in any process."""
    import random

    rng = random.Random(seed)
    return [rng.randrange(100, 31000) for _ in range(tokens)]


def _stop_group(p: subprocess.Popen, timeout: float) -> None:
    """Stop a process started in its own session, and whatever it started."""
    if p.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, signal.SIGKILL)  # its children too (vLLM's engine core)
    p.wait()


class LMCacheServer:
    """LMCache's multiprocess server with its L2 in `directory` (the `fs` adapter), its log in
    `log`. A start takes 10-30 s here."""

    READY = "cache server is running"
    # "Prefetch request completed (L1+L2): 8/8 retained keys (0 L1, 8 L2) in 1439.2 ms"
    LOADED = re.compile(
        r"Prefetch request completed \(L1\+L2\): (\d+)/(\d+) retained keys "
        r"\((\d+) L1, (\d+) L2\) in ([\d.]+) ms"
    )

    def __init__(
        self,
        directory: Path,
        log: Path,
        *,
        l1_gb: float = 4.0,
        port: int | None = None,
        adapter: dict | None = None,
    ):
        """`adapter`: the L2 adapter's type and options (default {"type": "fs"}: Python, one
        file at a time; {"type": "fs_native", "num_workers": 8}: LMCache's C++ connector, files
        in parallel); its base_path is `directory`."""
        self.directory, self.log, self.l1_gb = Path(directory), Path(log), l1_gb
        self.adapter = {"type": "fs", **(adapter or {}), "base_path": str(self.directory)}
        self.port = port or free_port()
        self.shm = f"kvfs-{os.getpid()}-{self.port}"
        self.proc: subprocess.Popen | None = None
        self._log_start = 0

    def start(self, timeout: float = 300) -> LMCacheServer:
        self._log_start = self.log.stat().st_size if self.log.exists() else 0
        adapter = json.dumps(self.adapter)
        with open(self.log, "ab") as f:
            self.proc = subprocess.Popen(
                [
                    str(ENGINE_PYTHON),
                    "-m",
                    "lmcache.v1.multiprocess.server",
                    "--port",
                    str(self.port),
                    "--chunk-size",
                    str(CHUNK_TOKENS),
                    "--l1-size-gb",
                    str(self.l1_gb),
                    "--eviction-policy",
                    "LRU",
                    "--supported-transfer-mode",
                    "auto",
                    "--l2-prefetch-policy",
                    "retain",
                    "--shm-name",
                    self.shm,
                    "--l2-adapter",
                    adapter,
                ],
                stdout=f,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                cwd=ROOT,
            )
        deadline = time.monotonic() + timeout
        while self.READY not in self._text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"LMCache's server did not start:\n{log_tail(self.log)}")
            time.sleep(0.5)
        self._warm_l1()
        return self

    def _warm_l1(self) -> None:
        """Give the server's DRAM (L1, a POSIX shared-memory file it creates sparse) its pages
        now, as a server that has been running a while has them. A restarted server (how the
        benchmarks empty its DRAM) would otherwise zero a fresh page for every 4 KiB it loads,
        and on a virtual machine whose memory the host backs lazily and takes back when it is
        free (virtio-balloon page reporting, as here) a fresh page costs the host's first
        touch: 1.2 GB/s here against 48 GB/s for a page touched before. That cost, the same
        for every directory, took most of the server's load of a prompt (perf: its loader
        threads in `clear_page_erms`); it is not storage. The pages are allocated in the
        file, so the server's own mapping of it finds them."""
        path = f"/dev/shm/lmcache_l1_pool_{self.shm}"
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            return  # (a server that names its pool otherwise: left as is)
        try:  # (written, not fallocated: tmpfs clears a fallocated page
            size = os.fstat(fd).st_size  # only when it is first used)
            zeros = memoryview(bytes(64 << 20))
            for off in range(0, size, len(zeros)):
                os.pwrite(fd, zeros[: size - off], off)
        finally:
            os.close(fd)

    def _text(self) -> str:
        try:
            with open(self.log, "rb") as f:
                f.seek(self._log_start)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def loads(self) -> list[dict]:
        """Each request's lookup since this start: chunks found, from LMCache's DRAM (L1) and
        from the directory (L2), and how long the load took."""
        return [
            {
                "found": int(m[1]),
                "asked": int(m[2]),
                "l1": int(m[3]),
                "l2": int(m[4]),
                "ms": float(m[5]),
            }
            for m in self.LOADED.finditer(self._text())
        ]

    def stop(self) -> None:
        if self.proc is not None:
            _stop_group(self.proc, 30)
            self.proc = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"/dev/shm/lmcache_l1_pool_{self.shm}")  # the server leaves it behind

    def __enter__(self) -> LMCacheServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class Engine:
    """vLLM (CPU) in its own process (`python -m testing.inference serve`) with dummy
    weights, given prompts one at a time: with `port`, connected to an LMCacheServer there
    (LMCacheMPConnector), else computing every prompt. vLLM's own prefix cache is off, so a
    prompt is either computed or loaded. A start takes 30-60 s here."""

    def __init__(
        self,
        model: Path,
        log: Path,
        *,
        port: int | None = None,
        kv_cache_gib: int = 4,
        max_tokens: int = 20000,
        nice: int = 0,
        connector: dict | None = None,
        env: dict | None = None,
        python: Path | None = None,
    ):
        """`nice`: the engine's processes run at this niceness (see bench/ttft.py).
        `connector`: another kv_transfer_config than the server's at `port` (e.g. LMCache's
        in-process LMCacheConnectorV1, configured by LMCACHE_CONFIG_FILE in `env`);
        `python`: the interpreter that has vLLM (default .venv-engine's)."""
        if connector is None and port:
            connector = {
                "kv_connector": "LMCacheMPConnector",
                "kv_role": "kv_both",
                "kv_connector_extra_config": {"lmcache.mp.port": port},
            }
        self.cfg = {"model": str(model), "connector": connector, "max_len": max_tokens + 16}
        self.log, self.kv_cache_gib, self.nice = Path(log), kv_cache_gib, nice
        self.env, self.python = dict(env or {}), Path(python or ENGINE_PYTHON)
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 600) -> Engine:
        r, w = os.pipe()
        env = {
            **os.environ,
            "VLLM_CPU_KVCACHE_SPACE": str(self.kv_cache_gib),
            "TOKENIZERS_PARALLELISM": "false",
            **self.env,
        }
        with open(self.log, "ab") as f:
            self.proc = subprocess.Popen(
                [
                    str(self.python),
                    "-m",
                    "testing.inference",
                    "serve",
                    json.dumps(self.cfg),
                    str(w),
                ],
                stdin=subprocess.PIPE,
                stdout=f,
                stderr=subprocess.STDOUT,
                pass_fds=(w,),
                start_new_session=True,
                cwd=ROOT,
                env=env,
                preexec_fn=(lambda: os.nice(self.nice)) if self.nice else None,
            )
        os.close(w)
        self._results = os.fdopen(r, "r")
        ready = self._read(timeout)
        if ready is None or "ready" not in ready:
            self.stop()
            raise RuntimeError(f"vLLM did not start:\n{log_tail(self.log)}")
        self.start_seconds = ready["ready"]
        return self

    def _read(self, timeout: float) -> dict | None:
        import select

        if not select.select([self._results], [], [], timeout)[0]:
            return None
        line = self._results.readline()
        return json.loads(line) if line else None

    def ttft(self, ids: list[int], timeout: float = 900) -> tuple[float, int]:
        """Time to first token of a prompt (seconds) and that token."""
        self.proc.stdin.write((json.dumps({"ids": ids}) + "\n").encode())
        self.proc.stdin.flush()
        out = self._read(timeout)
        if out is None or "error" in out:
            raise RuntimeError(
                f"vLLM failed on a prompt of {len(ids)} tokens: "
                f"{out and out.get('error')}\n{log_tail(self.log)}"
            )
        return out["seconds"], out["first"]

    def stop(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                pass
            _stop_group(self.proc, 10)
            self.proc = None
            self._results.close()

    def __enter__(self) -> Engine:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _serve(cfg: dict, result_fd: int) -> None:
    """In the engine's process (.venv-engine): build the LLM, then answer one prompt per line
    of stdin with {"seconds", "first"} on `result_fd`."""
    out = os.fdopen(result_fd, "w", buffering=1)
    t = time.monotonic()
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    kw = {}
    if cfg["connector"]:
        kw["kv_transfer_config"] = cfg["connector"]
    llm = LLM(
        model=cfg["model"],
        load_format="dummy",
        skip_tokenizer_init=True,
        enforce_eager=True,
        enable_prefix_caching=False,
        dtype="bfloat16",
        seed=0,
        max_model_len=cfg["max_len"],
        max_num_batched_tokens=cfg["max_len"],
        gpu_memory_utilization=0.3,
        **kw,
    )
    params = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False)
    out.write(json.dumps({"ready": time.monotonic() - t}) + "\n")
    for line in sys.stdin:
        try:
            ids = json.loads(line)["ids"]
            t = time.perf_counter()
            res = llm.generate([TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False)
            seconds = time.perf_counter() - t
            out.write(
                json.dumps({"seconds": seconds, "first": res[0].outputs[0].token_ids[0]}) + "\n"
            )
        except Exception as e:  # reported to the caller, which fails with the log
            out.write(json.dumps({"error": repr(e)}) + "\n")


if __name__ == "__main__" and len(sys.argv) == 4 and sys.argv[1] == "serve":
    _serve(json.loads(sys.argv[2]), int(sys.argv[3]))
