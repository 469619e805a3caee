"""A real redis-server for tests: started on 127.0.0.1 with a free port, in a temporary
directory, with append-only persistence; stop/start keep the data (to test restarts)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    def __init__(self, directory: Path, port: int | None = None):
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> "RedisServer":
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server is not installed (make install installs it)")
        self.proc = subprocess.Popen(
            [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
             "--appendonly", "yes", "--appendfsync", "always", "--save", "",
             "--protected-mode", "no", "--daemonize", "no", "--logfile",
             str(self.dir / "redis.log")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return self
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("redis-server did not start: "
                                   + (self.dir / "redis.log").read_text()[-2000:])
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
