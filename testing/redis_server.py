"""A real redis-server for tests: started on 127.0.0.1 with a free port, in a temporary
directory, with append-only persistence; stop/start keep the data (to test restarts)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path


def read_reply(f):
    """One RESP reply from a blocking binary file (socket.makefile("rb")); an error reply
    raises RuntimeError. For tests and benches that talk to Redis without trio."""
    line = f.readline()
    kind, rest = line[:1], line[1:].rstrip(b"\r\n")
    if kind == b"+":
        return rest
    if kind == b"-":
        raise RuntimeError(rest.decode())
    if kind == b":":
        return int(rest)
    if kind == b"$":
        n = int(rest)
        return None if n < 0 else f.read(n + 2)[:-2]
    if kind == b"*":
        n = int(rest)
        return None if n < 0 else [read_reply(f) for _ in range(n)]
    raise RuntimeError(f"unexpected reply from Redis: {line[:40]!r}")


def parse_info(raw: str) -> dict:
    """An INFO reply: its fields, and under "cmds" each command's (calls, usec) from its
    commandstats section."""
    out: dict = {"cmds": {}}
    for line in raw.splitlines():
        if ":" not in line or line.startswith("#"):
            continue
        k, v = line.split(":", 1)
        if k.startswith("cmdstat_"):
            f = dict(kv.split("=") for kv in v.split(","))
            out["cmds"][k[len("cmdstat_") :]] = (int(f["calls"]), float(f["usec"]))
        else:
            out[k] = v
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """`args`: extra redis-server options (a password, TLS). With `tls` set (a dict with cert,
    key, ca paths) the server listens for TLS only, on `port`, and `url` is rediss://."""

    def __init__(
        self,
        directory: Path,
        port: int | None = None,
        args: list[str] | None = None,
        tls: dict | None = None,
    ):
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.args = list(args or [])
        self.tls = tls
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"{'rediss' if self.tls else 'redis'}://127.0.0.1:{self.port}/0"

    def start(self) -> "RedisServer":
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server is not installed (make install installs it)")
        log = self.dir / "redis.log"
        ports = ["--port", str(self.port)]
        if self.tls:
            ports = [
                "--port",
                "0",
                "--tls-port",
                str(self.port),
                "--tls-cert-file",
                str(self.tls["cert"]),
                "--tls-key-file",
                str(self.tls["key"]),
                "--tls-ca-cert-file",
                str(self.tls["ca"]),
                "--tls-auth-clients",
                "yes" if self.tls.get("mutual") else "no",
            ]
        seen = log.stat().st_size if log.exists() else 0
        self.proc = subprocess.Popen(
            [
                exe,
                *ports,
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.dir),
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
                "--protected-mode",
                "no",
                "--daemonize",
                "no",
                "--logfile",
                str(log),
                *self.args,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while True:
            try:
                with open(log, "rb") as f:
                    f.seek(seen)
                    if b"Ready to accept connections" in f.read():
                        return self
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    "redis-server did not start: "
                    + (log.read_text()[-2000:] if log.exists() else "")
                )
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(20)
        self.proc = None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(20)
        self.proc = None
