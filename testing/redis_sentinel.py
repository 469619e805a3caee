"""A real replicated Redis for tests and benches: one master and its replicas (redis-server) and
three sentinels (redis-sentinel) on 127.0.0.1, each in its own directory under one temporary
one, configured as docs/cluster.md recommends (append-only, fsync always, min-replicas-to-write).

    group = SentinelGroup(tmp / "redis", replicas=1).start()
    cfg["cluster"] = {"sentinels": group.sentinel_addresses, "master_name": group.name}
    old = group.kill_master()          # kill -9 the master
    new = group.wait_failover(old)     # a replica promoted by the sentinels
    group.restart(old)                 # the old master comes back as a replica of the new one
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

from testing.redis_server import RedisServer, free_port, read_reply

# Detection after DOWN_AFTER_MS of silence, then an election among the three sentinels (quorum
# 2). 1 s made Sentinel fail over live masters on this loaded 2-core VM (a newly promoted
# master stalls that long while it serves two full syncs and rewrites its AOF), again and
# again, and promote a replica still loading its old data: acknowledged changes were lost,
# whatever kvfs waited for (docs/cluster.md). 5 s, as docs/cluster.md recommends for a
# deployment: a failover takes 6-8 s here. `down_after_ms` overrides it.
DOWN_AFTER_MS = 5000
FAILOVER_TIMEOUT_MS = 20000


def _ask(port: int, *args: str, timeout: float = 2.0) -> list | bytes | int | None:
    """One command to a server or a sentinel on 127.0.0.1 (RESP, blocking): its reply."""
    from kvfs.redis.resp import _encode

    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(_encode(args))
        return read_reply(s.makefile("rb"))


def _pairs(flat: list) -> dict:
    return dict(zip(flat[::2], flat[1::2]))


class SentinelGroup:
    def __init__(
        self,
        directory: Path,
        replicas: int = 1,
        sentinels: int = 3,
        name: str = "kvfs",
        min_replicas: int = 1,
        down_after_ms: int = DOWN_AFTER_MS,
    ):
        self.dir = directory
        self.down_after_ms = down_after_ms
        self.dir.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.min_replicas = min_replicas
        self.servers = [RedisServer(self.dir / f"redis{i}") for i in range(1 + replicas)]
        self.sentinel_ports = [free_port() for _ in range(sentinels)]
        self.sentinels: list[subprocess.Popen | None] = [None] * sentinels
        self.master = self.servers[0]

    @property
    def sentinel_addresses(self) -> list[str]:
        return [f"127.0.0.1:{p}" for p in self.sentinel_ports]

    def _args(self, master: RedisServer | None) -> list[str]:
        args = [
            "--min-replicas-to-write",
            str(self.min_replicas),
            "--min-replicas-max-lag",
            "10",
            "--repl-diskless-sync",
            "yes",
            "--repl-diskless-sync-delay",
            "0",
        ]
        if master is not None:
            args += ["--replicaof", "127.0.0.1", str(master.port)]
        return args

    def start(self) -> "SentinelGroup":
        if shutil.which("redis-sentinel") is None:
            raise RuntimeError("redis-sentinel is not installed (make install installs it)")
        self.master.args = self._args(None)
        self.master.start()
        for r in self.servers[1:]:
            r.args = self._args(self.master)
            r.start()
        self.wait_replicas(self.master, len(self.servers) - 1)
        for i in range(len(self.sentinels)):
            self._start_sentinel(i)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                known = [
                    int(_pairs(_ask(p, "SENTINEL", "master", self.name))[b"num-other-sentinels"])
                    for p in self.sentinel_ports
                ]
                if all(k == len(self.sentinels) - 1 for k in known):
                    return self
            except (OSError, RuntimeError, ValueError, IndexError):
                pass
            time.sleep(0.1)
        raise RuntimeError("the sentinels did not find each other within 20 s")

    def _start_sentinel(self, i: int) -> None:
        d = self.dir / f"sentinel{i}"
        d.mkdir(exist_ok=True)
        conf = d / "sentinel.conf"
        if not conf.exists():  # a restarted sentinel keeps what it learned
            conf.write_text(
                f"port {self.sentinel_ports[i]}\nbind 127.0.0.1\ndir {d}\n"
                f"logfile {d / 'sentinel.log'}\nprotected-mode no\n"
                f"sentinel monitor {self.name} 127.0.0.1 {self.master.port} 2\n"
                f"sentinel down-after-milliseconds {self.name} {self.down_after_ms}\n"
                f"sentinel failover-timeout {self.name} {FAILOVER_TIMEOUT_MS}\n"
                f"sentinel parallel-syncs {self.name} 1\n"
            )
        self.sentinels[i] = subprocess.Popen(
            [shutil.which("redis-sentinel"), str(conf)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                _ask(self.sentinel_ports[i], "PING")
                return
            except OSError:
                if time.monotonic() > deadline or self.sentinels[i].poll() is not None:
                    raise RuntimeError(
                        f"redis-sentinel {i} did not start: "
                        + (d / "sentinel.log").read_text()[-2000:]
                    ) from None
                time.sleep(0.05)

    def master_port(self) -> int | None:
        """The port the sentinels name as master now (the first that answers)."""
        for p in self.sentinel_ports:
            try:
                got = _ask(p, "SENTINEL", "get-master-addr-by-name", self.name)
                if got:
                    return int(got[1])
            except (OSError, RuntimeError):
                continue
        return None

    def server(self, port: int) -> RedisServer:
        return next(s for s in self.servers if s.port == port)

    def role(self, server: RedisServer) -> bytes | None:
        try:
            return _ask(server.port, "ROLE")[0]
        except (OSError, RuntimeError):
            return None

    def wait_replicas(self, master: RedisServer, n: int, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                info = _ask(master.port, "INFO", "replication").decode()
                if f"connected_slaves:{n}" in info and info.count("state=online") >= n:
                    return
            except (OSError, RuntimeError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"Redis at {master.port}: {n} replicas not in sync after {timeout:.0f} s"
                )
            time.sleep(0.05)

    def kill_master(self) -> RedisServer:
        """kill -9 the master; returns it (restart it with `restart`)."""
        old = self.server(self.master_port() or self.master.port)
        old.kill()
        return old

    def wait_failover(self, old: RedisServer, timeout: float = 30) -> RedisServer:
        """Until the sentinels name another master and it answers as one: that server."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            port = self.master_port()
            if port is not None and port != old.port and self.role(self.server(port)) == b"master":
                self.master = self.server(port)
                return self.master
            time.sleep(0.05)
        raise RuntimeError(f"no failover within {timeout:.0f} s")

    def restart(self, server: RedisServer, timeout: float = 60) -> None:
        """Start a killed server again as a replica of the current master (what the config
        file Sentinel rewrote would say), and wait until the master the sentinels name then
        has every other server in sync (on a loaded machine they may fail over again
        meanwhile: the master is asked again each time)."""
        port = self.master_port()
        if port is not None and port != server.port:
            self.master = self.server(port)
        server.args = self._args(self.master)
        server.start()
        deadline = time.monotonic() + timeout
        while True:
            port = self.master_port()
            if port is not None:
                self.master = self.server(port)
                try:
                    self.wait_replicas(self.master, len(self.servers) - 1, timeout=1)
                    return
                except RuntimeError:
                    pass
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"Redis at {server.port}: not back in sync within {timeout:.0f} s"
                )

    def switches(self) -> int:
        """Failovers the first sentinel has seen (its +switch-master lines): more than the
        masters a test killed means Sentinel also replaced live ones."""
        try:
            return (self.dir / "sentinel0" / "sentinel.log").read_text().count("+switch-master")
        except OSError:
            return 0

    def stop(self) -> None:
        for p in self.sentinels:
            if p is not None and p.poll() is None:
                p.terminate()
                p.wait(10)
        for s in self.servers:
            s.stop()
