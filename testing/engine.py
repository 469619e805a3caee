"""An inference engine's storage tier in its own process, driven by a test through a pipe.

Importing vLLM or SGLang takes several seconds, so a test module starts its engines once and
sends them commands, one JSON object per line: `{"op": "store", ...}` -> `{"ok": true,
"result": ...}`. Each engine process is a real, separate client of the mount (its own file
descriptors, page cache use, threads), as two inference servers on one node would be.

    with Engine("vllm", log_dir) as a:
        a.call("open", root="/mnt/kvfs/vllm")
        a.call("store", keys=[1, 2, 3])

The operations live in testing/<client>_ops.py as a dict OPS of functions taking the
engine's state (a dict kept between calls) and the command's keyword arguments.

Block contents are derived from the block's key (`content`), so any process can check what
any other stored.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import threading
import traceback
from pathlib import Path

import numpy as np

from testing.mount import log_tail

ROOT = Path(__file__).resolve().parents[1]


def content(key: int, nbytes: int) -> np.ndarray:
    """The bytes of block `key`: random, reproducible in any process."""
    return np.random.default_rng(key).integers(0, 256, nbytes, dtype=np.uint8)


class EngineError(RuntimeError):
    pass


class Engine:
    """A client library in a child process (see the module docstring)."""

    def __init__(self, client: str, log: Path, env: dict | None = None, timeout: float = 180.0):
        self.client = client
        self.log = log
        self.timeout = timeout
        cmd_r, self._cmd_w = os.pipe()
        self._res_r, res_w = os.pipe()
        logf = open(log, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "testing.engine", client, str(cmd_r), str(res_w)],
            pass_fds=(cmd_r, res_w),
            stdout=logf,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env={**os.environ, **(env or {})},
        )
        logf.close()
        os.close(cmd_r)
        os.close(res_w)
        self._out = os.fdopen(self._cmd_w, "w", buffering=1)
        self._in = os.fdopen(self._res_r, "r")
        self._ready = False

    def ready(self) -> "Engine":
        """Wait until the engine has imported its library."""
        if not self._ready:
            self._reply("start-up", self.timeout)
            self._ready = True
        return self

    def call(self, op: str, timeout: float | None = None, **kwargs):
        """Run one operation in the engine; returns its result or raises EngineError."""
        self.ready()
        self._out.write(json.dumps({"op": op, **kwargs}) + "\n")
        return self._reply(op, timeout or self.timeout)

    def _reply(self, op: str, timeout: float):
        reply: list[str] = []
        reader = threading.Thread(target=lambda: reply.append(self._in.readline()), daemon=True)
        reader.start()
        reader.join(timeout)
        if not reply or not reply[0]:
            raise EngineError(
                f"{self.client} engine: no answer to {op} "
                f"({'timed out' if not reply else 'exited'}):\n{self.log_text()}"
            )
        res = json.loads(reply[0])
        if not res["ok"]:
            raise EngineError(f"{self.client} engine: {op} failed:\n{res['error']}")
        return res["result"]

    def log_text(self) -> str:
        return log_tail(self.log)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self._out.write(json.dumps({"op": "exit"}) + "\n")
                self._out.flush()
            except OSError:
                pass
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for f in (self._out, self._in):
            try:
                f.close()
            except OSError:
                pass

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def serve(client: str, cmd_fd: int, res_fd: int) -> None:
    ops = importlib.import_module(f"testing.{client}_ops").OPS
    state: dict = {}
    with os.fdopen(cmd_fd, "r") as cmds, os.fdopen(res_fd, "w", buffering=1) as out:
        out.write(json.dumps({"ok": True, "result": "ready"}) + "\n")
        for line in cmds:
            cmd = json.loads(line)
            op = cmd.pop("op")
            if op == "exit":
                break
            try:
                res = {"ok": True, "result": ops[op](state, **cmd)}
            except Exception:  # noqa: BLE001 - reported to the test, which fails with it
                res = {"ok": False, "error": traceback.format_exc()}
            out.write(json.dumps(res) + "\n")
        if "close" in ops:
            try:
                ops["close"](state)
            except Exception:  # noqa: BLE001 - exiting anyway
                traceback.print_exc()
    sys.stdout.flush()
    os._exit(0)  # the libraries leave non-daemon threads behind


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
