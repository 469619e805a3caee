"""Drive the daemon's objects (files, catalog, store, pool) without the kernel."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Awaitable, Callable

import trio
import trio.testing

from kvfs import config
from kvfs.catalog.records import ROOT_INO
from kvfs.errors import KvfsError
from kvfs.fs.permissions import Caller
from kvfs.knobs import Knobs
from kvfs.service import Service, open_layers

# a direct client (kvfs/fs/direct_access.py) as root, the way the daemon's socket says who asks
ROOT = Caller(os.getpid(), 0, 0)


class FS:
    """Path-based helpers over `Files`, the way the FUSE layer would call it."""

    def __init__(self, svc: Service):
        self.svc = svc
        self.files = svc.files

    def resolve(self, path: str) -> tuple[int, bytes]:
        parts = [p.encode() for p in path.strip("/").split("/")]
        ino = ROOT_INO
        for p in parts[:-1]:
            ino = self.files.catalog.lookup(ino, p).ino
        return ino, parts[-1]

    def ino(self, path: str) -> int:
        parent, name = self.resolve(path)
        return self.files.catalog.lookup(parent, name).ino

    async def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        parent, name = self.resolve(path)
        try:
            node = self.files.catalog.lookup(parent, name)
        except KvfsError:
            if not flags & os.O_CREAT:
                raise
            r, _ = await self.files.create(parent, name, mode, flags, 0, 0)
            return r.fh
        return (await self.files.open(node.ino, flags)).fh

    async def close(self, fh: int) -> None:
        try:
            await self.files.flush(fh)
        finally:
            await self.files.release(fh)

    async def write(
        self,
        path: str,
        data: bytes,
        flags: int = os.O_CREAT | os.O_TRUNC | os.O_WRONLY,
        chunk: int = 1 << 20,
    ) -> None:
        fh = await self.open(path, flags)
        try:
            for off in range(0, len(data), chunk):
                await self.files.write(fh, off, data[off : off + chunk])
        finally:
            await self.close(fh)

    async def sync(self) -> None:
        """Every closed file durable (fsyncdir of the root does this through the mount): with
        durability "fsync" its block is in the pool and the catalog then, as at a close with
        "close"."""
        await self.files.sync_all()

    async def read_fh(self, fh: int, size: int, chunk: int = 1 << 20) -> bytes:
        out = bytearray()
        off = 0
        while off < size:
            b = await self.files.read(fh, off, chunk)
            if not b:
                break
            out += b
            off += len(b)
        return bytes(out)

    async def read(self, path: str) -> bytes:
        fh = await self.open(path, os.O_RDONLY)
        try:
            size = self.files.getattr(self.ino(path)).size
            return await self.read_fh(fh, size)
        finally:
            await self.close(fh)

    async def mkdir(self, path: str) -> None:
        parent, name = self.resolve(path)
        await self.files.mkdir(parent, name, 0o755, 0, 0)


async def open_service(cfg, stack: contextlib.AsyncExitStack) -> Service:
    """Open the layers for a loaded config (closed by `stack`) and compose the daemon's parts,
    as the daemon does (no FUSE)."""
    knobs = Knobs.from_config(cfg)
    layers = await open_layers(cfg, knobs, stack)
    return Service(cfg, layers, knobs)


def run_service(
    cfg_path: Path, fn: Callable[[FS], Awaitable[None]], clock=None, *, crash: bool = False
) -> None:
    """Open the layers for `cfg_path`, serve them in trio, run fn(fs), shut down. `clock`:
    a trio.testing.MockClock for the run (see `wait_out`). `crash`: stop as a killed daemon
    would, without the shutdown's write-back or commits (see `run_cluster`)."""
    run_cluster([cfg_path], fn, clock, crash=crash)


def run_cluster(
    cfg_paths: list[Path], fn: Callable[..., Awaitable[None]], clock=None, *, crash: bool = False
) -> None:
    """Open one node per config (for several: sharing a pool and a Redis), serve them all in
    one trio run, run fn(fs_a, fs_b, ...), shut down. With `crash` the shutdown is a kill's:
    files closed and not written back yet are not, and the catalog's open transaction is
    rolled back instead of committed (a write-back batch under way still finishes: its I/O
    cannot be stopped; a kill -9 of a mounted daemon, tests/mounted, has no such grace)."""
    cfgs = [config.load(p) for p in cfg_paths]

    async def main() -> None:
        async with contextlib.AsyncExitStack() as stack:
            services = [await open_service(cfg, stack) for cfg in cfgs]
            async with trio.open_nursery() as nursery:
                for svc in services:
                    await nursery.start(svc.serve)
                await fn(*[FS(svc) for svc in services])
                nursery.cancel_scope.cancel()
            for svc in services:
                if crash:
                    cat = svc.catalog
                    if cat.open_since is not None:  # (a SQLite catalog's open transaction)
                        cat._conn.execute("ROLLBACK")
                        cat.group._in_txn = False
                    continue
                with trio.CancelScope(shield=True):
                    await svc.stop()

    trio.run(main, clock=clock)


def mock_clock() -> trio.testing.MockClock:
    """A clock for deadline logic (leases, allocations, readahead streams, reconnects): it
    runs at the speed of real time, so I/O in worker threads sees no jump, until `wait_out`
    lets it jump."""
    return trio.testing.MockClock(rate=1.0)


async def wait_out(clock: trio.testing.MockClock, seconds: float) -> None:
    """Let `seconds` of trio time pass at once: the clock jumps to each deadline as soon as
    every task waits (autojump), so timers due meanwhile run in order, without sleeping."""
    clock.autojump_threshold = 0
    try:
        await trio.sleep(seconds)
    finally:
        clock.autojump_threshold = float("inf")


def known(fs: FS, path: str) -> bool:
    """Whether `path` names something in fs's catalog now."""
    try:
        fs.ino(path)
        return True
    except KvfsError:
        return False


async def eventually(predicate: Callable[[], bool], timeout: float = 10.0, what: str = "") -> None:
    """Wait (in trio) until predicate() holds (another node's change arrived, I/O ended)."""
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.01)
