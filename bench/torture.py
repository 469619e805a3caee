#!/usr/bin/env python3
"""Crash torture: writer processes hammer kvfs, the daemon is killed (-9) at random and at chosen
moments, the stale mount is cleared, kvfs is mounted again and every file is checked against
what its writer knew.

    python bench/torture.py [--cycles N] [--writers W] [--cluster [--failover | --shards N]]
                            [--seed S] [--json]
                            [--durability fsync|close] [--window-ms MS]
                            [--scenarios random,commit,...] [--minutes M] [--workdir DIR]

What the README promises and this checks, in `[mount] durability = "close"` (one node or a
shared pool, `--durability`): a file whose close() (or fsync(), or the rename that put it in
place) returned is there bit-exact after any crash. In "fsync" (the default): a
file whose fsync() returned is there bit-exact; a close, rename or unlink that returned at
least `--window-ms` (the write-back window and one batch's commit; WINDOW_BOUND_MS) before the
kill is there too, and one that returned later may be rolled back to an earlier outcome (counted
as `lost_in_window`, not a failure; `max_lost_window_ms` is the oldest such close seen). In
both modes a file whose writer had not closed it is absent or keeps its previous version, never
partial; with `evict = "lru"` a closed file may be deleted by kvfs to make room (only then may
a durable file be missing).

Writers
-------
W writer processes (`--writer`, started by the harness with the repository root as cwd) each
own a set of names (`w<i>f<j>`, so every name has one writer and its history is a sequence)
and loop over random operations on them, with sizes from 41 B to 9 MiB:

  write     open(O_CREAT|O_TRUNC), write in chunks of 4 KiB-1 MiB (sometimes with pwrite in a
            shuffled order, so write-behind sees rewritten units), close
  ftrunc    open(O_RDWR) an existing file, ftruncate(0), write, close
  fsync     write as above, fsync (a durable version), append a second segment, close
  tmp       write NAME.tmpV, then rename it over NAME: half the time after close (LMCache's fs
            connector), half the time while it is still open (the rename must commit it)
  append    open(O_WRONLY|O_APPEND), write a segment, close
  unlink    unlink
  check     read a file back and compare it with what the writer knows (a live check)

Every file is a sequence of segments; a segment is `<name|version|size>` followed by bytes
derived from (name, version), so a file's bytes say which version they claim to be and the
verifier can rebuild that version exactly. Each writer keeps a journal outside the mount, one
JSON line per event, written and fsynced BEFORE an operation starts (`start`, with the recipe
of the version it will make) and AFTER each call that makes something durable returned
(`done`: close, fsync, the rename; `done` of an unlink), plus `error` when a call failed (its
outcome is then unknown: either version is allowed, never a partial one) and `vanished` when
a name the writer had was gone (only an eviction may do that). Writers report their phase
(writing, closing a big file, renaming...) in a shared memory page so the harness can aim its
kills; they stop at an operation boundary when the harness asks, or when the mount dies.

Scenarios (one per cycle, in turn unless --scenarios says otherwise)
--------------------------------------------------------------------
  random    kill -9 the daemon (in cluster mode: one node or both) after a random delay
  commit    kill -9 while a writer is closing a file of 4 MiB or more (its commit: the last
            units, fdatasync, the catalog transaction), 0-15 ms after its close() began
  rename    kill -9 0-3 ms after a writer entered rename() (often of a still-open tmp file,
            which the rename commits first)
  evict     on a second, small pool (with evict = "lru"): kill -9 just after the daemon log
            shows an LRU eviction (in cluster mode, the cluster-wide LRU order)
  format    kill -9, verify, unmount cleanly, then run `kvfs format --force` and kill -9 IT at
            a random moment; mount again: kvfs must either serve the old files intact, serve
            an empty pool, or refuse to mount with a one-line reason (then a complete format
            must give an empty pool). Anything in between (some files, garbled files) counts.
  unmount   SIGTERM (a clean unmount begins) then kill -9 0-300 ms later
  writer    kill -9 a WRITER in the middle of writing a file of 1 MiB or more (the kernel then
            closes its files for it: that must commit nothing), let the others go on, then
            kill -9 the daemon at a random moment
cluster mode only (`--cluster`: a real redis-server with AOF and appendfsync always, two kvfs
nodes sharing the pool's namespaces; each writer's operations go to either node, but to
another node than a name's last one only once that node sees the name as the writer left it,
since nodes learn each other's changes through Redis's change log a moment later):
  publish   like commit: kill -9 the node whose writer is closing a big file (its publish)
  redis     kill -9 redis-server during a burst, restart it (AOF) 0.2-1.5 s later; writers
            see EIO meanwhile and go on; then kill -9 a node, or stop the writers (no crash).
            An EIO (or ETIMEDOUT) is excused only if the writer logged it between the kill of
            redis-server and REDIS_GRACE_MS after it was up again (a node retries Redis every
            0.5 s, kvfs/redis/link.py); any other counts as unexplained (`redis_errors_outside`)
`--failover` (implies --cluster; its only scenario unless --scenarios says otherwise, and
"redis" is not one): the pool's Redis is a master, two replicas and three sentinels
(testing/redis_sentinel.py, configured as docs/cluster.md recommends), and the nodes find the
master through Sentinel and wait for one replica's confirmation of each publish:
  failover  kill -9 the master 0-1.5 s into a burst; the sentinels promote a replica (about
            6-8 s: down-after 5 s); the killed server is started again at once as a replica of
            the new master (with `confirm = "all"`, the default, stores wait for it: it is a
            replica Sentinel knows of); once writers have committed again, half the time
            kill -9 a node. Errors are excused as in the redis scenario, from the kill until
            REDIS_GRACE_MS after the restarted server is in sync. Reported: `failover_ms` (the
            kill to the promoted master answering, as the harness sees it), `first_publish_ms`
            (the kill to the first close, rename or fsync that returned and whose operation
            started after the kill: an upper bound, it includes that operation's writes), the
            writers' live checks (reads) that succeeded and failed meanwhile (`reads_in_outage_ok`,
            `reads_in_outage_failed`), and `shared_extents`: stripe units that two block
            records of the promoted master's catalog both claim (space handed out twice).

After the kill the harness clears the stale mount (`MountedKvfs.kill`: umount, else umount -l),
waits for the writers to exit, mounts again and verifies.

The verifier
------------
It replays the journals on top of the state it saw after the previous cycle. For each name:
`durable` is the outcome of the last event whose call returned and made it durable (a version,
or "absent" after an unlink; see above for "fsync" mode), and `maybe` the outcomes of later
calls that returned without making theirs durable, and of operations started later whose calls
did not return (the daemon died in them, or they failed). Then for the file as mounted again:

  lost         absent though `durable` is a version (and no eviction explains it), or present
               with a version older than `durable`
  partial      present, but its bytes are not bit-exact any version of that name (this
               includes 0-byte files: every version has at least a 41-byte segment), or a
               `check` read back wrong bytes while the daemon was up
  zero_byte    (the 0-byte subset of partial)
  resurrected  present although its unlink returned (durable "absent") and nothing re-created it
  stray        a name no writer ever made
  evicted      absent, allowed because the daemon logged `pool full: evicting /NAME (SIZE bytes)`
               for that name with the durable version's size, at or after the moment the
               operation that made that version started (the log line is written before the
               eviction is made durable, so a logged eviction may not have happened, but an
               eviction that happened was logged). Outside the eviction scenario the pool is
               large enough that nothing is evicted; any eviction there is reported.
  divergent    (cluster) the two nodes' views of a file still differ 10 s after the remount
  shared_extents  (failover) a stripe unit claimed by two block records in Redis
  stale_in_outage  (redis, failover) a change the other node did not see within STALE_SECONDS
               while a Redis outage overlapped the wait: not a failure (no node learns
               anything then); waits that overlapped one are `max_seen_after_outage_ms`
  after_dropped_write_back  ("fsync", redis, failover) a file closed while Redis was away
               whose write-back was dropped (its node's allocation leases expired meanwhile:
               docs/cluster.md) and what follows: its writer finds it older or gone, or its
               next fsync reports EIO. Not a failure: an fsync'd file is never dropped
  stale_after_kill  ("fsync", cluster) likewise a change the other node never saw because the
               node that made it was killed within the write-back window after it (the close
               was rolled back: `lost_in_window`): not a failure
  hung         a writer that, asked to stop, stayed blocked in a request kvfs never answered
               (the harness then aborts the connections with umount -f and goes on)
  writer_failures  a writer process that exited non-zero or printed a Traceback, unless the
               harness killed it itself (the writer scenario, a writer that would not stop);
               `writer_failure_lines` has the last line of each one's stderr
  unaimed      a cycle whose aimed kill (commit, publish, rename, evict, writer) found no such
               moment within a minute and came at a random moment instead (not a failure: a
               measure of what the cycles really tested)

Whatever was found becomes the state the next cycle starts from; partial and stray files and
left-over tmp files are removed through the mount. Exit status 1 if lost, partial,
resurrected, stray, broken, hung or writer_failures is non-zero (or another FAILING figure).
`--json` prints one JSON object (figures per scenario); WORKDIR/cycles.jsonl gets one line per
finished cycle.
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import json
import mmap
import os
import random
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import dumps  # noqa: E402
from testing.mount import ROOT, MountedKvfs, wait_until, write_config  # noqa: E402

KiB, MiB = 1 << 10, 1 << 20
MIN_SIZE = 41
MAX_SIZE = 9 * MiB
NAMES_PER_WRITER = 10
ABSENT = -1  # the outcome "no such file"
SINGLE_SCENARIOS = ["random", "commit", "rename", "evict", "format", "unmount", "writer"]
CLUSTER_SCENARIOS = [
    "random",
    "publish",
    "rename",
    "redis",
    "evict",
    "commit",
    "format",
    "unmount",
    "writer",
]
DEAD_MOUNT = (errno.ENOTCONN, errno.ECONNABORTED, errno.ENODEV)
# Writer errors a scenario explains (any other fails the run): the daemon killed under the
# writer (every scenario), a full small pool (evict: ENOSPC, ENOENT for a file the pool
# evicted under the writer, ESTALE for a file another node evicted while this one wrote it),
# Redis down (redis: EIO, or ETIMEDOUT, and only while it is down: REDIS_GRACE_MS).
EXPLAINED = {
    "*": set(DEAD_MOUNT),
    "evict": {errno.ENOSPC, errno.ENOENT, errno.ESTALE},
    "redis": {errno.EIO, errno.ETIMEDOUT},
    "failover": {errno.EIO, errno.ETIMEDOUT},
}
OUTAGES = ("redis", "failover")  # scenarios whose Redis errors are excused in an outage
STALE_SECONDS = 5.0  # a node that does not see another's change by then: a stale view
# How long a change made on one node may take to be seen on the other (docs/cluster.md): the
# longest wait measured (`seen_after`) must stay under it.
STALE_BOUND_MS = 2000
# ("fsync" mode) a close that returned this long before the kill must have survived it: the
# write-back window (`[mount] writeback_ms`, 100 ms) plus the time one batch takes to write and
# commit on this loaded machine. The longest window seen is reported (`max_lost_window_ms`).
WINDOW_BOUND_MS = 2000
# (redis) a writer's EIO is excused from the moment redis-server is killed until this long after
# it is up again: a node that found Redis down tries again 0.5 s after each failed call
# (kvfs/redis/link.py, RECONNECT_SECONDS), and a connection left idle since before the kill fails
# once more when next used, which puts the next try 0.5 s later again. Measured: at most 0.96 s
# after the restart in 32 outages (seeds 7 and 11); the latest excused error of a run is
# reported (`max_redis_error_after_up_ms`).
REDIS_GRACE_MS = 2000


# --- content -------------------------------------------------------------------------------------
def segment(name: str, version: int, size: int) -> bytes:
    """`size` bytes that name (name, version) and are derived from them."""
    header = f"<{name}|{version}|{size}>".encode()
    if size < len(header):
        raise ValueError(f"segment of {size} bytes is too short for its header")
    seed = int.from_bytes(
        hashlib.blake2b(f"{name}/{version}".encode(), digest_size=8).digest(), "little"
    )
    return header + random.Random(seed).randbytes(size - len(header))


def build(recipe: list) -> bytes:
    """A version's bytes from its recipe: [[name, version, size], ...] (segments in order)."""
    return b"".join(segment(n, v, s) for n, v, s in recipe)


_HEADER = re.compile(rb"<([^|<>]{1,64})\|(\d{1,9})\|(\d{1,9})>")


def parse(data: bytes) -> list | None:
    """The segments `data` claims to consist of, or None if it is not a sequence of them."""
    out, off = [], 0
    while off < len(data):
        m = _HEADER.match(data, off)
        if m is None:
            return None
        size = int(m.group(3))
        if size < m.end() - off or off + size > len(data):
            return None
        out.append([m.group(1).decode(errors="replace"), int(m.group(2)), size])
        off += size
    return out or None


def base_name(name: str) -> str:
    return name.split(".tmp", 1)[0]


# --- the shared control page (stop flag, writers' phases) ----------------------------------------
PH_IDLE, PH_WRITE, PH_CLOSE, PH_FSYNC, PH_RENAME, PH_UNLINK = b"IWCSRU"
_SLOT = struct.Struct("<cBxxxxxxqq")  # phase, node, size of the file it concerns, done events


class Control:
    """One page in /dev/shm: byte 0 asks the writers to stop; slot i is writer i's phase."""

    def __init__(self, path: Path, writers: int, create: bool = False):
        size = 64 + _SLOT.size * max(writers, 1)
        if create:
            with open(path, "wb") as f:
                f.write(bytes(size))
        self.fd = os.open(path, os.O_RDWR)
        self.map = mmap.mmap(self.fd, size)
        self.writers = writers

    def stop(self, on: bool = True) -> None:
        self.map[0] = 1 if on else 0

    @property
    def stopping(self) -> bool:
        return self.map[0] == 1

    def set(self, i: int, phase: int, node: int, size: int, done: int) -> None:
        _SLOT.pack_into(self.map, 64 + _SLOT.size * i, bytes([phase]), node, size, done)

    def get(self, i: int) -> tuple[int, int, int, int]:
        ph, node, size, d = _SLOT.unpack_from(self.map, 64 + _SLOT.size * i)
        return ph[0], node, size, d

    def done_total(self) -> int:
        return sum(self.get(i)[3] for i in range(self.writers))

    def close(self) -> None:
        self.map.close()
        os.close(self.fd)


# --- the writer process --------------------------------------------------------------------------
class Fd:
    """A file an operation closes itself (`Writer.close`: the close is part of the operation,
    its error the operation's); leaving the `with` block closes it quietly if the operation
    stopped before that."""

    def __init__(self, fd: int):
        self.fd = fd

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        os.close(fd)

    def __enter__(self) -> "Fd":
        return self

    def __exit__(self, *exc) -> None:
        if self.fd >= 0:
            try:
                os.close(self.fd)
            except OSError:
                pass


class Writer:
    def __init__(self, a):
        self.i = a.index
        self.rng = random.Random(a.seed)
        self.ctl = Control(Path(a.control), a.writers)
        self.roots = [os.open(m, os.O_RDONLY | os.O_DIRECTORY) for m in a.mounts]
        for m, r in zip(a.mounts, self.roots):  # not the bare directory under a mount
            if os.fstat(r).st_dev == os.stat(Path(m).parent).st_dev:
                raise SystemExit(f"writer {self.i}: {m} is not mounted")
        self.journal = open(a.journal, "a")
        # name -> {"v": version or None (absent), "recipe", "size", "maxv", "unknown", "node"}
        self.state: dict[str, dict] = json.loads(Path(a.state).read_text())
        self.names = sorted(self.state)
        self.done = 0
        self.node = 0  # the node the current operation goes through
        self.started: str | None = None  # the name of the last operation started

    # journal -------------------------------------------------------------------------------------
    def log(self, **rec) -> None:
        rec["t"] = time.time()
        rec["w"] = self.i
        if rec["op"] == "start":
            self.started = rec["name"]
            rec.setdefault("node", getattr(self, "node", 0))  # which node's mount it used
        self.journal.write(json.dumps(rec) + "\n")
        self.journal.flush()
        os.fsync(self.journal.fileno())
        if rec["op"] == "done":
            self.done += 1

    def phase(self, ph: int, size: int = 0) -> None:
        self.ctl.set(self.i, ph, self.node, size, self.done)

    # helpers -------------------------------------------------------------------------------------
    def next_version(self, name: str) -> int:
        st = self.state[name]
        st["maxv"] += 1
        return st["maxv"]

    def pick_size(self, big_share: float = 0.2) -> int:
        r = self.rng.random()
        if r < big_share:
            return self.rng.randint(2 * MiB, MAX_SIZE)
        if r < big_share + 0.2:
            return self.rng.randint(256 * KiB, 2 * MiB)
        if r < big_share + 0.45:
            return self.rng.randint(4 * KiB, 256 * KiB)
        return self.rng.randint(MIN_SIZE, 4 * KiB)

    def open_at(self, name: str, flags: int, root: int) -> Fd | None:
        """`name` opened under `root`, or None where it is gone (logged: see `vanished`)."""
        try:
            return Fd(os.open(name, flags, dir_fd=root))
        except FileNotFoundError:
            self.vanished(name)
            return None

    def close(self, f: Fd, size: int) -> None:
        self.phase(PH_CLOSE, size)
        f.close()

    def put(self, fd: int, data: bytes, base: int, sequential: bool = False) -> None:
        chunks, off = [], 0
        while off < len(data):
            n = self.rng.choice([4 * KiB, 64 * KiB, 128 * KiB, 1 * MiB, self.rng.randint(1, MiB)])
            chunks.append((off, data[off : off + n]))
            off += n
        if sequential:  # O_APPEND: the kernel chooses the offset
            for _, c in chunks:
                view = memoryview(c)
                while view:
                    view = view[os.write(fd, view) :]
            return
        if len(chunks) > 1 and self.rng.random() < 0.15:
            self.rng.shuffle(chunks)
        for off, c in chunks:
            view = memoryview(c)
            while view:
                n = os.pwrite(fd, view, base + off)
                view, off = view[n:], off + n

    def set_state(self, name: str, v: int | None, recipe: list | None, node: int) -> None:
        st = self.state[name]
        st.update(
            v=v,
            recipe=recipe,
            size=len(build(recipe)) if recipe else 0,
            unknown=False,
            node=node,
            t_done=time.monotonic(),
        )

    def root(self, name: str) -> tuple[int, int]:
        """The node for the next operation on `name` (cluster: either). Nodes learn each
        other's changes through Redis's change log, a moment later: an operation goes to
        another node than the name's last one only once that node sees the name as it is
        (an O_TRUNC open of a name unlinked elsewhere a millisecond ago would otherwise reach
        the old inode, and its close drop the content: cross-node ordering, not crash
        safety, which is what this checks)."""
        st = self.state[name]
        node = self.rng.randrange(len(self.roots))
        if node != st["node"] and not st["unknown"] and not self.sees(self.roots[node], name, st):
            self.log(op="stale_view", name=name, node=node, want=st["size"])
            node = st["node"]
        self.node = node
        return node, self.roots[node]

    # operations ----------------------------------------------------------------------------------
    def op_write(self, name: str, kind: str) -> None:
        """write (O_TRUNC), ftrunc (O_RDWR + ftruncate) or fsync (write, fsync, append, close)."""
        node, root = self.root(name)
        v = self.next_version(name)
        recipe = [[name, v, self.pick_size()]]
        data = build(recipe)
        self.log(op="start", kind=kind, name=name, v=v, recipe=recipe)
        self.phase(PH_WRITE, len(data))
        if kind == "ftrunc":
            f = self.open_at(name, os.O_RDWR, root)
            if f is None:
                return
        else:
            f = Fd(os.open(name, os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o644, dir_fd=root))
        with f:
            if kind == "ftrunc":
                os.ftruncate(f.fd, 0)
            self.put(f.fd, data, 0)
            if kind == "fsync":
                self.phase(PH_FSYNC, len(data))
                os.fsync(f.fd)
                self.log(op="done", name=name, v=v, sync=True)
                self.set_state(name, v, recipe, node)
                v = self.next_version(name)
                recipe = recipe + [[name, v, self.pick_size(0.05)]]
                tail = segment(*recipe[-1])
                self.log(op="start", kind="append", name=name, v=v, recipe=recipe)
                self.put(f.fd, tail, len(data))
                data += tail
            self.close(f, len(data))
        self.log(op="done", name=name, v=v)
        self.set_state(name, v, recipe, node)

    def op_tmp(self, name: str) -> None:
        node, root = self.root(name)
        v = self.next_version(name)
        recipe = [[name, v, self.pick_size()]]
        data = build(recipe)
        tmp = f"{name}.tmp{v}"
        close_first = self.rng.random() < 0.5
        self.log(op="start", kind="tmp", name=name, tmp=tmp, v=v, recipe=recipe)
        self.phase(PH_WRITE, len(data))
        with Fd(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644, dir_fd=root)) as f:
            self.put(f.fd, data, 0)
            if close_first:
                self.close(f, len(data))
                self.log(op="done", name=tmp, v=v)
            self.phase(PH_RENAME, len(data))
            os.rename(tmp, name, src_dir_fd=root, dst_dir_fd=root)
            self.log(op="done", kind="rename", name=name, tmp=tmp, v=v)
            self.set_state(name, v, recipe, node)
            if not close_first:
                self.close(f, len(data))

    def op_append(self, name: str) -> None:
        st = self.state[name]
        node, root = self.root(name)
        v = self.next_version(name)
        recipe = st["recipe"] + [[name, v, self.pick_size(0.05)]]
        tail = segment(*recipe[-1])
        self.log(op="start", kind="append", name=name, v=v, recipe=recipe)
        f = self.open_at(name, os.O_WRONLY | os.O_APPEND, root)
        if f is None:
            return
        with f:
            have = os.fstat(f.fd).st_size
            if have != st["size"]:
                self.log(op="badbase", name=name, have=have, want=st["size"], node=node)
                self.state[name]["unknown"] = True
                return
            self.phase(PH_WRITE, st["size"] + len(tail))
            self.put(f.fd, tail, 0, sequential=True)
            self.close(f, st["size"] + len(tail))
        self.log(op="done", name=name, v=v)
        self.set_state(name, v, recipe, node)

    def op_unlink(self, name: str) -> None:
        node, root = self.root(name)
        self.log(op="start", kind="unlink", name=name)
        self.phase(PH_UNLINK)
        try:
            os.unlink(name, dir_fd=root)
        except FileNotFoundError:
            self.vanished(name)
            return
        self.log(op="done", kind="unlink", name=name)
        self.set_state(name, None, None, node)

    def op_check(self, name: str) -> None:
        st = self.state[name]
        root = self.roots[st["node"]]
        try:
            fd = os.open(name, os.O_RDONLY, dir_fd=root)
        except FileNotFoundError:
            self.vanished(name)
            return
        except OSError as e:
            self.log(op="read", name=name, ok=False, errno=e.errno)
            raise
        try:
            got = b""
            while True:
                b = os.read(fd, 4 * MiB)
                if not b:
                    break
                got += b
        except OSError as e:
            self.log(op="read", name=name, ok=False, errno=e.errno)
            raise
        finally:
            os.close(fd)
        self.log(op="read", name=name, ok=got == build(st["recipe"]))
        if got != build(st["recipe"]):
            self.log(
                op="badread",
                name=name,
                v=st["v"],
                got=len(got),
                want=st["size"],
                claims=(parse(got) or [[None, None, None]])[-1][:2],
            )

    def vanished(self, name: str) -> None:
        """The name is gone though this writer had it: only an eviction may do that."""
        self.log(op="vanished", name=name, v=self.state[name]["v"])
        self.state[name].update(v=None, recipe=None, size=0, unknown=False)

    def gone_everywhere(self, name: str, st: dict) -> bool:
        """The name is gone on the node that left it too (an eviction, in the evict scenario:
        the node that evicted it knows first, the other one a moment later)."""
        try:
            os.stat(name, dir_fd=self.roots[st["node"]])
            return False
        except FileNotFoundError:
            return True

    def sees(self, root: int, name: str, st: dict) -> bool:
        """Whether the node of `root` sees `name` as this writer left it (polled: its
        follower applies the other node's change a moment later)."""
        deadline = time.monotonic() + STALE_SECONDS
        first = True
        while time.monotonic() < deadline:
            try:
                size = os.stat(name, dir_fd=root).st_size
                seen = st["v"] is not None and size == st["size"]
            except FileNotFoundError:
                seen = st["v"] is None  # (the stat must run: a name left absent is seen so)
                if not seen and self.gone_everywhere(name, st):
                    return True  # evicted meanwhile: not a stale view (the next
                    # operation finds it vanished and says so)
            if seen:
                if not first and "t_done" in st:  # how long the change took to be seen
                    self.log(
                        op="seen_after",
                        name=name,
                        ms=round((time.monotonic() - st["t_done"]) * 1000, 1),
                    )
                return True
            first = False
            time.sleep(0.01)
        return False

    def step(self) -> None:
        name = self.rng.choice(self.names)
        st = self.state[name]
        r = self.rng.random()
        if st["unknown"]:  # after an error: only content-independent operations
            kind = "unlink" if r < 0.1 else "tmp" if r < 0.4 else "write"
        elif st["v"] is None:
            kind = "write" if r < 0.55 else "tmp" if r < 0.85 else "fsync"
        else:
            kind = (
                "write"
                if r < 0.25
                else "tmp"
                if r < 0.5
                else "append"
                if r < 0.62
                else "fsync"
                if r < 0.72
                else "ftrunc"
                if r < 0.8
                else "unlink"
                if r < 0.92
                else "check"
            )
            if kind == "append" and st["size"] > MAX_SIZE - MiB:
                kind = "write"
        if kind in ("write", "ftrunc", "fsync"):
            self.op_write(name, kind)
        else:
            getattr(self, "op_" + kind)(name)

    def run(self) -> int:
        self.phase(PH_IDLE)  # tells the harness this writer is up
        while not self.ctl.stopping:
            self.phase(PH_IDLE)
            self.started = None
            try:
                self.step()
            except OSError as e:
                self.log(op="error", name=self.started, errno=e.errno, what=str(e)[:200])
                # the operation in flight (the last `start`) has an unknown outcome
                if self.started in self.state:
                    self.state[self.started]["unknown"] = True
                if e.errno in DEAD_MOUNT or self.mount_dead():
                    return 0
        self.phase(PH_IDLE)
        return 0

    def mount_dead(self) -> bool:
        for r in self.roots:
            try:
                os.fstatvfs(r)
            except OSError:
                return True
        return False


def writer_main(a) -> int:
    return Writer(a).run()


# --- journals and verification -------------------------------------------------------------------
@dataclass
class Expect:
    durable: int = ABSENT  # a version, or ABSENT
    maybe: set = field(default_factory=set)
    since: float = 0.0  # when the operation that made `durable` started
    # ("fsync" mode) outcomes whose call returned after `durable`'s but that were not made
    # durable (a close, rename or unlink within the write-back window before the kill):
    # (outcome, when its call returned), oldest first; each may be lost
    weak: list = field(default_factory=list)


@dataclass
class Figures:
    cycles: int = 0
    commits: int = 0
    lost: int = 0
    partial: int = 0
    zero_byte: int = 0
    resurrected: int = 0
    stray: int = 0
    evicted: int = 0
    unexplained_evictions: int = 0
    divergent: int = 0
    writer_errors: int = 0
    stale_views: int = 0
    broken: int = 0  # the torture could not go on (kvfs did not mount again)
    hung: int = 0  # a writer stuck in a request kvfs never answered
    unaimed: int = 0  # an aimed kill whose moment never came (killed anyway)
    unexplained_errors: int = 0  # writer errors the cycle's scenario does not explain
    # (redis) of those, the EIO/ETIMEDOUT logged while its Redis was up (outside the outage
    # and its grace); and the outages the cycles made
    redis_errors_outside: int = 0
    redis_outages: int = 0
    writer_failures: int = 0  # writer processes that crashed (not killed by the harness)
    lost_in_window: int = 0  # ("fsync" mode) closes within the window lost: allowed
    format_outcomes: dict = field(default_factory=dict)
    errnos: dict = field(default_factory=dict)  # writer errors by errno name
    seen_after_ms: list = field(default_factory=list)  # (cluster) waits for the other node
    lost_window_ms: list = field(default_factory=list)  # kill - close of each lost close
    writer_failure_lines: list = field(default_factory=list)  # each crash's last stderr line
    # (redis) how long after Redis was up again each excused error came (0 if before)
    redis_error_after_up_ms: list = field(default_factory=list)
    # (failover) see the module docstring
    shared_extents: int = 0
    reads_in_outage_ok: int = 0
    reads_in_outage_failed: int = 0
    failover_ms: list = field(default_factory=list)
    first_publish_ms: list = field(default_factory=list)
    # (redis, failover) a change another node saw only after an outage it overlapped: not held
    # to STALE_BOUND_MS / STALE_SECONDS (no node learns anything while Redis is away)
    stale_in_outage: int = 0
    seen_after_outage_ms: list = field(default_factory=list)
    # ("fsync", cluster) a change the other node never saw because the node that made it was
    # killed within the write-back window after it (the close rolled back: lost_in_window)
    stale_after_kill: int = 0
    # ("fsync", outages) what follows from a write-back dropped in an outage (a close made
    # while Redis was away, on a node whose leases expired meanwhile): a writer that later
    # finds the file at an earlier version or gone, or whose fsync reports the dropped
    # write-back (EIO, as Linux reports one to the first fsync after it)
    after_dropped_write_back: int = 0

    # per-event samples, summarised in the report rather than listed
    SAMPLES = (
        "seen_after_ms",
        "lost_window_ms",
        "redis_error_after_up_ms",
        "failover_ms",
        "first_publish_ms",
        "seen_after_outage_ms",
    )

    def reported(self) -> dict:
        """The figures as the JSON report lists them (without the per-event samples)."""
        return {k: v for k, v in self.__dict__.items() if k not in self.SAMPLES}

    def add(self, o: "Figures") -> None:
        for k, v in o.__dict__.items():
            if isinstance(v, int):
                setattr(self, k, getattr(self, k) + v)
            elif isinstance(v, list):
                getattr(self, k).extend(v)
            else:
                mine = getattr(self, k)
                for kk, vv in v.items():
                    mine[kk] = mine.get(kk, 0) + vv

    @property
    def failures(self) -> int:
        return (
            self.lost
            + self.partial
            + self.resurrected
            + self.stray
            + self.broken
            + self.hung
            + self.divergent
            + self.unexplained_evictions
            + self.shared_extents
            + self.unexplained_errors
            + self.stale_views
            + self.writer_failures
        )


@dataclass
class Eviction:
    t: float
    name: str
    size: int


# (any logger: which module logs it is not the harness's business; the move of kvfs.files to
# kvfs.fs.files made every eviction look like a lost file)
_EVICT = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \S+ \S+: pool full: "
    r"evicting /(\S+) \((\d+) bytes\)"
)


def evictions_in(text: str) -> list[Eviction]:
    out = []
    for line in text.splitlines():
        m = _EVICT.match(line)
        if m:
            t = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            out.append(Eviction(t, m.group(2), int(m.group(3))))
    return out


# --- the pool(s) under test ----------------------------------------------------------------------
class Instance:
    """One kvfs pool under test: one node (SQLite catalog) or two (Redis), its writers' names,
    the state found after the last cycle, and every version's recipe."""

    def __init__(
        self,
        name: str,
        work: Path,
        *,
        nodes: int,
        ns_size: str,
        evict: bool,
        redis: str | None = None,
        stripe_unit: str | None = None,
        dram: str = "64MiB",
        durability: str = "fsync",
        dirs: list[str] | None = None,
    ):
        """`redis`: the [cluster] keys that reach the pool's Redis (its URL, or sentinels).
        `dirs`: directories the writers' names are spread over (made at each start; with
        shards, each directory's files are in its own shard)."""
        self.name = name
        self.dirs = list(dirs or [])
        self.durability = durability
        self.killed_at: float | None = None  # the last kill -9 of a node this cycle
        self.dir = work / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.redis = redis
        nss = [{"path": str(self.dir / f"ns{i}.img"), "size": ns_size} for i in range(3)]
        pool = 'evict = "lru"' if evict else ""
        if stripe_unit:
            pool += f'\nstripe_unit = "{stripe_unit}"'
        self.configs, self.nodes = [], []
        for k in range(nodes):
            extra = ""
            if redis is not None:
                extra = (
                    f'[cluster]\n{redis}\nnode_id = "{name}{k}"\n'
                    f'name = "{name}"\ngrace_seconds = 1.0\nlease_seconds = 2.0\n'
                    f"regions = 12\n"
                )
            mount = f'durability = "{durability}"'
            cfg = write_config(
                self.dir / f"node{k}.toml",
                self.dir / f"state{k}",
                nss,
                dram=dram,
                extra=extra,
                pool=pool,
                mount=mount,
            )
            self.configs.append(cfg)
            self.nodes.append(MountedKvfs(self.dir / f"mnt{k}", cfg, self.dir / f"node{k}.log"))
        self.state: dict[str, dict] = {}  # what the last verification found
        self.recipes: dict[str, dict[int, list]] = {}
        self.maxv: dict[str, int] = {}
        self.log_offsets = [0] * nodes
        self.cycle_logs: list[str] = []  # (one_cycle) each node's log of the cycle

    @property
    def mounts(self) -> list[Path]:
        return [n.mountpoint for n in self.nodes]

    def up(self) -> bool:
        return all(n.proc is not None and n.proc.poll() is None for n in self.nodes)

    def start(self) -> None:
        for n in self.nodes:
            if n.proc is None or n.proc.poll() is not None:
                n.proc = None
                n.start(60)
        for d in self.dirs:  # (again after a format)
            (self.mounts[0] / d).mkdir(exist_ok=True)
        for m in self.mounts:
            for d in self.dirs:
                wait_until(lambda p=m / d: p.is_dir(), 20, f"directory {d} on every node")

    def list_names(self, mount: Path) -> list[str]:
        """The files a verification reads: those at the root and in the directories."""
        out = [n for n in os.listdir(mount) if n not in self.dirs]
        for d in self.dirs:
            try:
                out += [f"{d}/{n}" for n in os.listdir(mount / d)]
            except FileNotFoundError:
                pass
        return sorted(out)

    def stop(self) -> None:
        for n in self.nodes:
            n.stop(60)

    def kill(self, which: list[int] | None = None) -> None:
        self.killed_at = time.time()
        for k in range(len(self.nodes)) if which is None else which:
            self.nodes[k].kill()

    def new_log(self, k: int) -> str:
        """The part of node k's log written since the last call."""
        try:
            with open(self.nodes[k].log, "rb") as f:
                f.seek(self.log_offsets[k])
                data = f.read()
        except FileNotFoundError:
            return ""
        self.log_offsets[k] += len(data)
        return data.decode(errors="replace")

    def count_evictions(self, k: int) -> int:
        """Evictions node k logged since the last `new_log(k)` (without consuming them)."""
        try:
            with open(self.nodes[k].log, "rb") as f:
                f.seek(self.log_offsets[k])
                return f.read().count(b"pool full: evicting")
        except FileNotFoundError:
            return 0

    def names_for(self, writer: int) -> list[str]:
        if self.dirs:
            return [
                f"{self.dirs[(writer + j) % len(self.dirs)]}/w{writer}f{j}"
                for j in range(NAMES_PER_WRITER)
            ]
        return [f"w{writer}f{j}" for j in range(NAMES_PER_WRITER)]

    def writer_state(self, writer: int) -> dict:
        out = {}
        for name in self.names_for(writer):
            st = self.state.get(name)
            rec = self.recipes.get(name, {}).get(st) if st is not None else None
            out[name] = {
                "v": st,
                "recipe": rec,
                "size": len(build(rec)) if rec else 0,
                "maxv": self.maxv.get(name, 0),
                "unknown": False,
                "node": 0,
            }
        return out


# --- the harness ---------------------------------------------------------------------------------
class Torture:
    def __init__(
        self,
        work: Path,
        *,
        writers: int = 4,
        cluster: bool = False,
        seed: int = 1,
        scenarios: list[str] | None = None,
        quiet: bool = True,
        durability: str = "fsync",
        window_ms: float = WINDOW_BOUND_MS,
        failover: bool = False,
        follow_replicas: bool = False,
        shards: int = 1,
    ):
        self.work = work
        self.shards = shards
        self.shard_servers: list = []  # (--shards) the Redis servers of shards 1, 2, ...
        cluster = cluster or failover
        self.failover = failover
        self.follow_replicas = follow_replicas
        if failover and "redis" in (scenarios or []):
            raise ValueError("--failover: the redis scenario restarts a lone Redis; not here")
        self.durability = durability
        self.window_ms = window_ms
        self.writers = writers
        self.cluster = cluster
        self.rng = random.Random(seed)
        self.seed = seed
        self.quiet = quiet
        self.scenarios = scenarios or (
            ["failover"] if failover else CLUSTER_SCENARIOS if cluster else SINGLE_SCENARIOS
        )
        self.figures: dict[str, Figures] = {}
        self.problems: list[str] = []
        self.cycle = 0
        self.fig = Figures()
        self.redis = None  # the Redis server (with --failover, the master now)
        self.group = None  # (--failover) master, replicas, sentinels
        self.killed_writers: set[int] = set()  # pids of writers the harness killed itself
        # ("fsync") names closed while Redis was away: their write-back may have been dropped
        self.dropped_maybe: set[str] = set()
        # ... and through which nodes: a dropped write-back's error is reported to the next
        # fsync of the file on the node that dropped it (Linux's errseq is per inode, and each
        # node has its own), so an fsync through another node does not clear it
        self.dropped_on: dict[str, set] = {}
        # (redis) this cycle's outages: [time.time() of the kill, of the restart's end or None]
        self.outages: list[list] = []
        keys = None
        if failover:
            from testing.redis_sentinel import SentinelGroup

            self.group = SentinelGroup(work / "redis", replicas=2).start()
            self.redis = self.group.master
            keys = (
                f"sentinels = {json.dumps(self.group.sentinel_addresses)}\n"
                f'master_name = "{self.group.name}"'
                + ("\nfollow_replicas = true" if follow_replicas else "")
            )
        elif cluster:
            from testing.redis_server import RedisServer

            self.redis = RedisServer(work / "redis").start()
            keys = f'redis = "{self.redis.url}"'
            if shards > 1:
                self.shard_servers = [
                    RedisServer(work / f"redis{k}").start() for k in range(1, shards)
                ]
                keys += "\nshards = [" + ", ".join(f'"{x.url}"' for x in self.shard_servers)
                keys += "]"
        n = 2 if cluster else 1
        # (--shards) the writers' names in directories, whose files are in their shards
        dirs = [f"d{k}" for k in range(4 * shards)] if shards > 1 else None
        # main: large enough that nothing is evicted (40 names of at most ~18 MiB each, plus
        # tmp files); small: evict = "lru" evicts all the time
        self.main = Instance(
            "main",
            work,
            nodes=n,
            ns_size="512MiB",
            evict=True,
            redis=keys,
            stripe_unit="256KiB" if cluster else None,
            durability=self.durability,
            dirs=dirs,
        )
        self.small = Instance(
            "small",
            work,
            nodes=n,
            ns_size="24MiB",
            evict=True,
            redis=keys,
            stripe_unit="256KiB" if cluster else None,
            dram="16MiB",
            durability=self.durability,
            dirs=dirs,
        )
        self.format_seconds = 0.5

    def say(self, msg: str) -> None:
        if not self.quiet:
            print(msg, file=sys.stderr, flush=True)

    def missed(self, fig: Figures, what: str) -> None:
        """An aimed kill found no moment to aim at: it comes at a random moment instead."""
        fig.unaimed += 1
        self.say(f"  ({what}; killing anyway)")

    def problem(self, msg: str) -> None:
        self.problems.append(f"cycle {self.cycle}: {msg}")
        self.say("  PROBLEM " + msg)

    # writers -----------------------------------------------------------------------------------
    def start_writers(self, inst: Instance, cdir: Path, ctl_path: Path) -> list:
        procs = []
        for i in range(self.writers):
            state = cdir / f"w{i}.state.json"
            state.write_text(json.dumps(inst.writer_state(i)))
            with open(cdir / f"w{i}.err", "wb") as err:
                procs.append(
                    subprocess.Popen(
                        [
                            sys.executable,
                            str(Path(__file__).resolve()),
                            "--writer",
                            "--index",
                            str(i),
                            "--writers",
                            str(self.writers),
                            "--control",
                            str(ctl_path),
                            "--journal",
                            str(cdir / f"w{i}.journal"),
                            "--state",
                            str(state),
                            "--seed",
                            str(self.rng.randrange(1 << 30)),
                            *[a for m in inst.mounts for a in ("--mount", str(m))],
                        ],
                        cwd=ROOT,
                        stdout=subprocess.DEVNULL,
                        stderr=err,
                    )
                )
                procs[-1].err_path = cdir / f"w{i}.err"
                procs[-1].index = i
        return procs

    def writer_failed(self, p, fig: Figures) -> str | None:
        """Whether writer `p` (exited) crashed: it exited non-zero or printed a Traceback, and
        the harness did not kill it; counted in `fig`. The last line of its stderr, if so."""
        try:
            err = p.err_path.read_text(errors="replace")
        except OSError:
            err = ""
        if (p.pid in self.killed_writers and p.returncode == -signal.SIGKILL) or (
            p.returncode == 0 and "Traceback" not in err
        ):
            return None
        lines = [ln for ln in err.splitlines() if ln.strip()]
        last = lines[-1].strip() if lines else f"(no output; exit status {p.returncode})"
        fig.writer_failures += 1
        fig.writer_failure_lines.append(last[:300])
        self.problem(f"writer {p.index} (pid {p.pid}) exited with {p.returncode}: {last[:300]}")
        return last

    def end_writers(
        self, inst: Instance, procs: list, ctl: Control, fig: Figures, timeout: float = 60
    ) -> None:
        ctl.stop()
        deadline = time.monotonic() + timeout
        for p in procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.killed_writers.add(p.pid)
                p.kill()
                try:
                    p.wait(10)
                    self.problem(f"writer {p.pid} did not stop in {timeout}s; killed")
                except subprocess.TimeoutExpired:
                    # stuck in a request no daemon answers: abort the connections, and
                    # restart the nodes before verifying
                    fig.hung += 1
                    self.problem(
                        f"writer {p.pid} hung in a request kvfs never answered; "
                        f"connections aborted (umount -f)"
                    )
                    for m in inst.mounts:
                        subprocess.run(["umount", "-f", str(m)], capture_output=True)
                    p.wait(60)
                    inst.kill()
        for p in procs:
            if p.returncode is not None:
                self.writer_failed(p, fig)

    # kills ---------------------------------------------------------------------------------------
    def wait_phase(
        self, ctl: Control, phase: int, min_size: int, timeout: float, which: list | None = None
    ) -> int | None:
        """Wait until a writer is in `phase` on a file of at least `min_size` bytes; the node
        it works through (and its index in `which`), or None at the deadline."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for i in range(self.writers):
                ph, node, size, _ = ctl.get(i)
                if ph == phase and size >= min_size:
                    if which is not None:
                        which.append(i)
                    return node
            time.sleep(0.0005)
        return None

    def pick_nodes(self, inst: Instance) -> list[int]:
        n = len(inst.nodes)
        if n == 1:
            return [0]
        r = self.rng.random()
        return [0, 1] if r < 0.2 else [self.rng.randrange(n)]

    def run_scenario(
        self, scenario: str, inst: Instance, ctl: Control, procs: list, fig: Figures
    ) -> None:
        def ready() -> bool:
            for p in procs:
                if p.poll() is not None:
                    err = [
                        ln
                        for ln in p.err_path.read_text(errors="replace").splitlines()
                        if ln.strip()
                    ]
                    raise RuntimeError(
                        f"writer {p.pid} exited with {p.returncode} at start: "
                        f"{err[-1] if err else '(no output)'}"
                    )
            return all(ctl.get(i)[0] != 0 for i in range(self.writers))

        wait_until(ready, 60, "the writers to start", interval=0.01)
        # let the writers commit something first
        base = ctl.done_total()
        wait_until(
            lambda: ctl.done_total() >= base + 2 * self.writers,
            120,
            "the writers' first commits",
            interval=0.01,
        )
        if scenario == "random":
            time.sleep(self.rng.uniform(0.0, 2.0))
            inst.kill(self.pick_nodes(inst))
        elif scenario in ("commit", "publish"):
            time.sleep(self.rng.uniform(0.0, 0.5))
            node = self.wait_phase(ctl, PH_CLOSE, 4 * MiB, 60)
            if node is None:
                self.missed(fig, "no big close seen")
            time.sleep(self.rng.uniform(0.0, 0.015))
            inst.kill([node or 0])
        elif scenario == "rename":
            time.sleep(self.rng.uniform(0.0, 0.5))
            node = self.wait_phase(ctl, PH_RENAME, 0, 60)
            if node is None:
                self.missed(fig, "no rename seen")
            time.sleep(self.rng.uniform(0.0, 0.003))
            inst.kill([node or 0])
        elif scenario == "evict":
            want, seen = self.rng.randrange(1, 4), []
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not seen:
                for k in range(len(inst.nodes)):
                    if inst.count_evictions(k) >= want:
                        seen.append(k)
                time.sleep(0.002)
            if not seen:
                self.missed(fig, "no eviction seen")
            time.sleep(self.rng.uniform(0.0, 0.005))
            inst.kill(seen or self.pick_nodes(inst))
        elif scenario == "unmount":
            time.sleep(self.rng.uniform(0.0, 1.5))
            which = self.pick_nodes(inst)
            for k in which:
                inst.nodes[k].proc.send_signal(signal.SIGTERM)
            time.sleep(self.rng.uniform(0.0, 0.3))
            inst.kill(which)
        elif scenario == "redis":
            time.sleep(self.rng.uniform(0.0, 1.0))
            self.outages.append([time.time(), None])
            server = self.rng.choice([self.redis, *self.shard_servers])  # (--shards: any)
            server.kill()
            time.sleep(self.rng.uniform(0.2, 1.5))
            server.start()
            self.outages[-1][1] = time.time()
            self.after_outage_ends(inst, ctl, "commits after Redis came back", kill_share=0.7)
        elif scenario == "failover":
            time.sleep(self.rng.uniform(0.0, 1.5))
            self.outages.append([time.time(), None])
            old = self.group.kill_master()
            self.group.wait_failover(old, timeout=60)
            fig.failover_ms.append(round((time.time() - self.outages[-1][0]) * 1000, 1))
            # back at once, as a replica of the new master: with confirm = "all" (the default)
            # the killed server is a replica Sentinel knows of, and stores wait for it
            self.group.restart(old)
            self.redis = self.group.master  # (a loaded machine may have failed over again)
            self.outages[-1][1] = time.time()
            self.after_outage_ends(inst, ctl, "commits after the failover", kill_share=0.5)
        elif scenario == "format":
            time.sleep(self.rng.uniform(0.0, 1.0))
            inst.kill(self.pick_nodes(inst))
        elif scenario == "writer":
            which: list[int] = []
            if self.wait_phase(ctl, PH_WRITE, MiB, 60, which) is None:
                self.missed(fig, "no big write seen")
            else:
                time.sleep(self.rng.uniform(0.0, 0.02))
                self.killed_writers.add(procs[which[0]].pid)
                procs[which[0]].kill()
                procs[which[0]].wait()
            time.sleep(self.rng.uniform(0.2, 1.5))
            inst.kill(self.pick_nodes(inst))
        else:
            raise ValueError(f"unknown scenario {scenario}")

    def after_outage_ends(self, inst: Instance, ctl: Control, what: str, kill_share: float) -> None:
        """(redis, failover) Once every writer has committed again, kill -9 a node (or both) in
        `kill_share` of the cycles; otherwise the writers are simply stopped afterwards."""
        base = ctl.done_total()
        wait_until(lambda: ctl.done_total() >= base + self.writers, 120, what, interval=0.01)
        if self.rng.random() < kill_share:
            time.sleep(self.rng.uniform(0.0, 1.0))
            inst.kill(self.pick_nodes(inst))

    # verification --------------------------------------------------------------------------------
    def durable_now(self, inst: Instance, rec: dict) -> bool:
        """Whether the call `rec` says returned made its outcome durable: always in "close"
        mode; in "fsync" mode an fsync, or any call that returned at least the write-back
        window before the kill (none this cycle: a clean stop made everything durable), but
        not one made while Redis was away (a write-back publishes once Redis is back)."""
        if inst.durability == "close" or rec.get("sync", False):
            return True
        if self.in_outage(rec["t"], rec["t"] + self.window_ms / 1000):
            # its write-back waits for Redis, and a node whose allocation leases expired
            # meanwhile (lease_seconds 2 here, shorter than a failover) must drop what it
            # wrote in that space (docs/cluster.md): the close is not durable yet
            return False
        return inst.killed_at is None or rec["t"] < inst.killed_at - self.window_ms / 1000

    def replay(
        self, inst: Instance, cdir: Path, fig: Figures, scenario: str = "random"
    ) -> tuple[dict, list]:
        exp: dict[str, Expect] = {}
        for name, v in inst.state.items():
            exp[name] = Expect(durable=v if v is not None else ABSENT)
        vanished = []
        first_publish = None
        for i in range(self.writers):
            for name in inst.names_for(i):
                exp.setdefault(name, Expect())
            jp = cdir / f"w{i}.journal"
            if not jp.exists():
                continue
            started: dict[str, float] = {}
            tmp_of: dict[str, str] = {}  # name -> the tmp file its operation in flight renames
            node_of: dict[str, object] = {}  # name -> the node its operation in flight went to
            for line in jp.read_text().splitlines():
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue  # a line cut by the writer's death
                op, name = rec["op"], rec.get("name")
                if op == "start":
                    started[name] = rec["t"]
                    node_of[name] = rec.get("node")
                    tmp_of.pop(name, None)
                    if rec["kind"] == "unlink":
                        exp[name].maybe.add(ABSENT)
                        continue
                    v = rec["v"]
                    inst.recipes.setdefault(name, {})[v] = rec["recipe"]
                    inst.maxv[name] = max(inst.maxv.get(name, 0), v)
                    exp[name].maybe.add(v)
                    if rec["kind"] == "tmp":
                        tmp = rec["tmp"]
                        inst.recipes.setdefault(tmp, {})[v] = rec["recipe"]
                        exp.setdefault(tmp, Expect()).maybe.add(v)
                        started[tmp] = rec["t"]
                        tmp_of[name] = tmp
                elif op == "done":
                    fig.commits += 1
                    if scenario == "failover" and rec.get("kind") != "unlink" and self.outages:
                        kill = self.outages[0][0]
                        if started.get(name, 0.0) > kill:
                            first = round((rec["t"] - kill) * 1000, 1)
                            first_publish = min(first_publish or first, first)
                    outcome = ABSENT if rec.get("kind") == "unlink" else rec["v"]
                    if inst.durability == "fsync" and self.in_outage(
                        rec["t"], rec["t"] + self.window_ms / 1000
                    ):
                        self.dropped_maybe.add(name)  # (its write-back waited for Redis)
                        self.dropped_on.setdefault(name, set()).add(node_of.get(name))
                    if rec.get("sync", False):  # (fsync'd since: no drop left to report there)
                        self._reported(name, node_of.get(name))
                    if self.durable_now(inst, rec):
                        exp[name] = Expect(outcome, set(), started.get(name, 0.0))
                        if rec.get("kind") == "rename":
                            exp[rec["tmp"]] = Expect(ABSENT, set(), started.get(name, 0.0))
                    else:
                        exp[name].maybe.add(outcome)
                        exp[name].weak.append((outcome, rec["t"]))
                        if rec.get("kind") == "rename":
                            exp[rec["tmp"]].maybe.add(ABSENT)
                elif op == "vanished":
                    # an eviction the writer saw need not be durable yet: after a crash the
                    # file may be back (as it was), or gone
                    vanished.append((name, rec.get("v"), exp[name]))
                    v = rec.get("v")
                    exp[name] = Expect(ABSENT, {v} if v is not None else set(), rec["t"])
                elif op == "error":
                    fig.writer_errors += 1
                    code = errno.errorcode.get(rec.get("errno"), str(rec.get("errno")))
                    fig.errnos[code] = fig.errnos.get(code, 0) + 1
                    if rec.get("errno") == errno.ENOENT and tmp_of.get(name) in self.dropped_maybe:
                        # a rename of a tmp file whose write-back was dropped (a new file
                        # loses its name with it)
                        fig.after_dropped_write_back += 1
                        self.dropped_maybe.discard(tmp_of[name])
                    elif (
                        rec.get("errno") == errno.EIO
                        and name in self.dropped_maybe
                        and self.after_outage(rec["t"]) is None
                    ):
                        # an fsync reporting a write-back dropped in an earlier outage (once:
                        # Linux's errseq), in whatever scenario the next fsync of the file
                        # came: the nodes stay up from one cycle to the next
                        fig.after_dropped_write_back += 1
                        self._reported(name, node_of.get(name))
                    elif rec.get("errno") not in EXPLAINED["*"] | EXPLAINED.get(scenario, set()):
                        fig.unexplained_errors += 1
                        self.problem(f"writer {i} in a {scenario} cycle: {code} {json.dumps(rec)}")
                    elif scenario in OUTAGES and rec.get("errno") not in EXPLAINED["*"]:
                        # Redis's errors are explained only while Redis was down
                        after = self.after_outage(rec["t"])
                        if after is None and name in self.dropped_maybe:
                            # an fsync reporting a write-back dropped in an earlier outage
                            # (once: Linux's errseq)
                            fig.after_dropped_write_back += 1
                            self.dropped_maybe.discard(name)
                        elif after is None:
                            fig.unexplained_errors += 1
                            fig.redis_errors_outside += 1
                            self.problem(
                                f"writer {i}: {code} while Redis was up "
                                f"({self.outage_text(rec['t'])}): {json.dumps(rec)}"
                            )
                        else:
                            fig.redis_error_after_up_ms.append(after)
                    # a rename that failed may still have happened (Redis applied it, and its
                    # reply was lost): the tmp file may be gone, its content under the final
                    # name, which later operations may since have overwritten
                    if name in tmp_of:
                        exp[tmp_of.pop(name)].maybe.add(ABSENT)
                elif (
                    op == "stale_view"
                    and scenario in OUTAGES
                    and self.in_outage(rec["t"] - STALE_SECONDS, rec["t"])
                ):
                    fig.stale_in_outage += 1  # (nodes cannot learn changes while it lasts)
                elif (
                    op == "stale_view"
                    and inst.durability == "fsync"
                    and inst.killed_at is not None
                    and rec["t"] - STALE_SECONDS - self.window_ms / 1000
                    <= inst.killed_at
                    <= rec["t"]
                ):
                    fig.stale_after_kill += 1  # (its write-back died with the node)
                elif op == "stale_view":
                    fig.stale_views += 1
                    self.problem(
                        f"writer {i}: node {rec.get('node')} did not see {name} as "
                        f"left within {STALE_SECONDS:.0f} s"
                    )
                elif (
                    op == "seen_after"
                    and scenario in OUTAGES
                    and self.in_outage(rec["t"] - rec["ms"] / 1000, rec["t"])
                ):
                    fig.seen_after_outage_ms.append(rec["ms"])
                elif op == "seen_after":
                    fig.seen_after_ms.append(rec["ms"])
                elif op == "read":
                    if scenario == "failover" and self.after_outage(rec["t"]) == 0.0:
                        if rec["ok"]:
                            fig.reads_in_outage_ok += 1
                        else:
                            fig.reads_in_outage_failed += 1
                elif (
                    op in ("badbase", "badread")
                    and name in self.dropped_maybe
                    and (op == "badbase" or self.whole_version(inst, rec))
                ):
                    # the version it knew was never published: the file reads as an earlier
                    # one, whole (the files themselves are checked after the cycle); a check
                    # before its next append or truncate finds the same
                    fig.after_dropped_write_back += 1
                elif op in ("badread", "badbase"):
                    fig.partial += 1
                    self.problem(f"writer {i}: {op} {json.dumps(rec)}")
        if first_publish is not None:
            fig.first_publish_ms.append(first_publish)
        elif scenario == "failover":
            self.problem("no publish after the failover")
        return exp, vanished

    @staticmethod
    def whole_version(inst: Instance, rec: dict) -> bool:
        """Whether a live read that got another version than its writer's got a whole one:
        as long as the version its bytes claim."""
        claims = rec.get("claims") or [None, None]
        recipe = inst.recipes.get(claims[0], {}).get(claims[1])
        return recipe is not None and len(build(recipe)) == rec.get("got")

    def _reported(self, name: str, node) -> None:
        """An fsync of `name` through `node` returned (its error, or none): nothing dropped
        there is left to report; the name leaves `dropped_maybe` once no node has any."""
        nodes = self.dropped_on.get(name)
        if nodes is not None:
            nodes.discard(node)
            if nodes:
                return
            del self.dropped_on[name]
        self.dropped_maybe.discard(name)

    def after_outage(self, t: float) -> float | None:
        """How long after its Redis was up again (ms, 0 if still down) an error at time `t`
        came, if within an outage of this cycle and REDIS_GRACE_MS after it; else None."""
        for down, up in self.outages:
            if down <= t and (up is None or t <= up + REDIS_GRACE_MS / 1000):
                return 0.0 if up is None or t <= up else round((t - up) * 1000, 1)
        return None

    def in_outage(self, a: float, b: float) -> bool:
        """Whether [a, b] overlaps one of this cycle's outages (and its REDIS_GRACE_MS)."""
        return any(
            a <= (up if up is not None else b) + REDIS_GRACE_MS / 1000 and b >= down
            for down, up in self.outages
        )

    def outage_text(self, t: float) -> str:
        return (
            "; ".join(
                f"{(t - down) * 1000:+.0f} ms from the kill of redis-server"
                f"{' (the master)' if self.failover else ''}, "
                + (f"{(t - up) * 1000:+.0f} ms from its restart" if up else "no restart")
                for down, up in self.outages
            )
            or "no outage this cycle"
        )

    def read_views(self, inst: Instance) -> list[dict[str, bytes]]:
        views = []
        for m in inst.mounts:
            view = {}
            for name in inst.list_names(m):
                try:
                    view[name] = (m / name).read_bytes()
                except OSError as e:
                    view[name] = e  # EIO: a checksum mismatch, say
            views.append(view)
        return views

    def verify(
        self,
        inst: Instance,
        cdir: Path,
        fig: Figures,
        evictions: list[Eviction],
        scenario: str = "random",
    ) -> None:
        exp, vanished = self.replay(inst, cdir, fig, scenario)
        views = self.read_views(inst)
        if len(views) > 1:

            def agree() -> bool:
                nonlocal views
                if all(_digest(v) == _digest(views[0]) for v in views[1:]):
                    return True
                views = self.read_views(inst)
                return False

            try:
                wait_until(agree, 10, "the nodes to agree", interval=0.2)
            except TimeoutError:
                a, b = views[0], views[1]
                diff = sorted(
                    n for n in set(a) | set(b) if _digest({n: a.get(n)}) != _digest({n: b.get(n)})
                )
                fig.divergent += len(diff)
                self.problem(
                    f"{inst.name}: nodes disagree on {diff[:10]} ("
                    + "; ".join(f"{n}: {_seen(a.get(n))} vs {_seen(b.get(n))}" for n in diff[:3])
                    + ")"
                    + "".join(
                        f"; node {k}'s last cluster warnings: {_cluster_lines(text)}"
                        for k, text in enumerate(inst.cycle_logs)
                    )
                )
        present = views[0]
        by_name: dict[str, list[Eviction]] = {}
        for e in evictions:
            by_name.setdefault(e.name, []).append(e)

        def evicted(name: str, v: int, since: float) -> bool:
            rec = inst.recipes.get(name, {}).get(v)
            size = len(build(rec)) if rec else -1
            return any(e.size == size and e.t >= since - 0.05 for e in by_name.get(name, []))

        def lost_closes(e: Expect, outcome: int) -> None:
            """("fsync" mode) the closes within the window that the crash rolled back."""
            if not e.weak:
                return
            found = [k for k, (o, _) in enumerate(e.weak) if o == outcome]
            if found:
                lost = e.weak[found[-1] + 1 :]
            elif outcome == e.durable:
                lost = e.weak
            else:
                lost = []  # an operation in flight at the kill went through
            if lost:
                fig.lost_in_window += len(lost)
                if inst.killed_at is not None:  # (else dropped in a Redis outage)
                    fig.lost_window_ms.append(round((inst.killed_at - lost[0][1]) * 1000, 1))

        for name, v, e in vanished:
            if name in self.dropped_maybe:
                fig.after_dropped_write_back += 1  # (a new file dropped loses its name)
                self.dropped_maybe.discard(name)
                continue
            if v is not None and not evicted(name, v, e.since):
                fig.lost += 1
                self.problem(
                    f"{inst.name}: {name} v{v} vanished under its writer (no eviction logged)"
                )
        new_state: dict[str, int | None] = {}
        remove: list[str] = []
        # tmp names last: a tmp file whose rename went through is absent, its content under
        # the final name
        seen: dict[str, int] = {}
        for name in sorted(set(exp) | set(present), key=lambda n: (".tmp" in n, n)):
            e = exp.get(name)
            data = present.get(name)
            if e is None:
                fig.stray += 1
                self.problem(
                    f"{inst.name}: stray name {name!r} "
                    f"({len(data) if isinstance(data, bytes) else data})"
                )
                remove.append(name)
                continue
            allowed = {e.durable} | e.maybe
            if data is None:
                if ABSENT in allowed:
                    pass
                elif ".tmp" in name and seen.get(base_name(name)) == e.durable:
                    pass  # renamed into place
                elif evicted(name, e.durable, e.since) or any(
                    evicted(name, o, e.since) for o, _ in e.weak if o != ABSENT
                ):
                    fig.evicted += 1  # (an eviction of a later, closed version
                    #                                  removes the name too)
                else:
                    fig.lost += 1
                    self.problem(
                        f"{inst.name}: {name} lost: v{e.durable} committed, file absent"
                        f" (allowed {sorted(allowed)})"
                    )
                lost_closes(e, ABSENT)
                new_state[name] = None
                continue
            if isinstance(data, OSError):
                fig.partial += 1
                self.problem(f"{inst.name}: {name} unreadable: {data}")
                remove.append(name)
                new_state[name] = None
                continue
            segs = parse(data)
            claim = segs[-1][1] if segs else None
            recipe = inst.recipes.get(name, {}).get(claim)
            if (
                segs is None
                or recipe is None
                or segs[-1][0] != base_name(name)
                or build(recipe) != data
            ):
                fig.partial += 1
                if len(data) == 0:
                    fig.zero_byte += 1
                self.problem(
                    f"{inst.name}: {name} partial: {len(data)} bytes, claims "
                    f"{segs[-1] if segs else None}; durable v{e.durable}, allowed "
                    f"{sorted(allowed)} ({_compare(inst, name, data, allowed)})"
                )
                (cdir / f"partial-{name}").write_bytes(data)
                remove.append(name)
                new_state[name] = None
                continue
            if claim in allowed:
                pass
            elif e.durable == ABSENT:
                fig.resurrected += 1
                self.problem(
                    f"{inst.name}: {name} resurrected: v{claim} present after its unlink returned"
                )
            elif claim < e.durable:
                fig.lost += 1
                self.problem(f"{inst.name}: {name} lost: has v{claim}, v{e.durable} committed")
            else:
                fig.partial += 1
                self.problem(f"{inst.name}: {name} has v{claim}, allowed {sorted(allowed)}")
            lost_closes(e, claim)
            new_state[name] = claim
            seen[name] = claim
            if ".tmp" in name:
                remove.append(name)
        for name in remove:
            try:
                os.unlink(inst.mounts[0] / name)
            except FileNotFoundError:
                pass
            new_state[name] = None
        inst.state = {n: v for n, v in new_state.items() if v is not None and ".tmp" not in n}

    # the format scenario's second half -----------------------------------------------------------
    def kvfs_format(
        self, inst: Instance, kill_after: float | None
    ) -> subprocess.CompletedProcess | None:
        cmd = [sys.executable, "-m", "kvfs", "format", "--force", "--config", str(inst.configs[0])]
        t0 = time.monotonic()
        p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if kill_after is None:
            out, _ = p.communicate(120)
        else:
            try:
                p.wait(kill_after)
            except subprocess.TimeoutExpired:
                p.kill()
            out, _ = p.communicate()
        if p.returncode == 0:  # aim the next kill within a whole format's time
            self.format_seconds = time.monotonic() - t0
        return subprocess.CompletedProcess(cmd, p.returncode, out, b"")

    def format_cycle(self, inst: Instance, fig: Figures) -> None:
        inst.stop()
        if self.redis is not None:  # a killed node's leases must lapse first
            self._wait_no_leases(inst)
        delay = self.rng.uniform(0.0, self.format_seconds * 1.2)
        r = self.kvfs_format(inst, delay)
        killed = r.returncode == -signal.SIGKILL
        if self.redis is not None:  # the operator's step after a killed format
            self._redis_cli("DEL", f"kvfs:{{{inst.name}}}:init")
        try:
            inst.start()
            outcome = "mounted"
        except (RuntimeError, TimeoutError) as e:
            inst.kill()
            first = [ln for ln in str(e).splitlines() if "kvfs:" in ln or "Error" in ln][-1:]
            outcome = "refused"
            self.say(f"  mount after killed format refused: {first}")
            r2 = self.kvfs_format(inst, None)
            if r2.returncode != 0:
                self.problem(f"format after a killed format failed: {r2.stdout[-500:]!r}")
            inst.start()
        names = inst.list_names(inst.mounts[0])
        if outcome == "mounted" and names:
            # the old pool must be intact: verify it as it was
            empty = Figures()
            before = dict(inst.state)
            self.verify(inst, self.work / "empty-cycle", empty, [], "format")
            if inst.state != before or empty.failures:
                self.problem(
                    f"after a killed format: {len(names)} names, not the old pool "
                    f"intact ({empty.failures} failures)"
                )
            fig.add(empty)
            key = "old pool intact"
        else:
            if names:
                self.problem(f"after a killed format and a full format: {len(names)} names")
                fig.partial += len(names)
            inst.state = {}
            key = "empty pool" if outcome == "mounted" else "refused, formatted again"
        fig.format_outcomes[key] = fig.format_outcomes.get(key, 0) + 1
        self.say(f"  format killed after {delay:.3f}s (rc {r.returncode}, killed {killed}): {key}")

    @property
    def redis_port(self) -> int:
        """The port of the Redis server (with --failover, of the master the sentinels name)."""
        if self.group is not None:
            return self.group.master_port() or self.group.master.port
        return self.redis.port

    def check_extents(self, inst: Instance, fig: Figures) -> None:
        """(failover) No stripe unit claimed by two block records in the master's catalog:
        space handed out twice across a failover would show here."""
        from kvfs.catalog.redis.codec import parse_blob, record
        from testing.redis_sentinel import _ask

        port, prefix = self.redis_port, f"kvfs:{{{inst.name}}}:"
        keys, cursor = [], b"0"
        while True:
            cursor, batch = _ask(port, "SCAN", cursor, "MATCH", prefix + "b:*", "COUNT", "1000")
            keys += batch
            if cursor == b"0":
                break
        units = []
        for k in keys:
            h = record(_ask(port, "HGETALL", k))
            if h:
                rec = parse_blob(int(k.rsplit(b":", 1)[1]), h)
                units += [(e.ns, e.offset, e.end, rec.id) for e in rec.layout.unit_extents()]
        units.sort()
        for a, b in zip(units, units[1:]):
            if a[0] == b[0] and b[1] < a[2]:
                fig.shared_extents += 1
                self.problem(
                    f"{inst.name}: blocks {a[3]} and {b[3]} both claim namespace "
                    f"{a[0]} bytes {b[1]}-{min(a[2], b[2])}"
                )

    def _redis_cli(self, *args: str) -> str:
        return subprocess.run(
            ["redis-cli", "-p", str(self.redis_port), *args],
            capture_output=True,
            text=True,
            timeout=20,
        ).stdout

    def _wait_no_leases(self, inst: Instance) -> None:
        wait_until(
            lambda: (
                not self._redis_cli("--scan", "--pattern", f"kvfs:{{{inst.name}}}:lease:*").strip()
            ),
            30,
            "the killed node's leases to lapse",
            interval=0.1,
        )

    # one cycle -----------------------------------------------------------------------------------
    def one_cycle(self, scenario: str) -> Figures:
        self.cycle += 1
        fig = Figures(cycles=1)
        self.fig = fig  # (what a cycle that breaks off still found)
        self.outages = []
        inst = self.small if scenario == "evict" else self.main
        inst.killed_at = None
        other = self.main if inst is self.small else self.small
        if other.up():
            other.stop()
        inst.start()
        for k in range(len(inst.nodes)):
            inst.new_log(k)  # evictions are read from what follows
        cdir = self.work / f"cycle{self.cycle:04d}-{scenario}"
        cdir.mkdir(parents=True)
        ctl_path = Path("/dev/shm") / f"kvfs-torture-{os.getpid()}-{self.cycle}"
        ctl = Control(ctl_path, self.writers, create=True)
        t0 = time.monotonic()
        try:
            procs = self.start_writers(inst, cdir, ctl_path)
            try:
                self.run_scenario(scenario, inst, ctl, procs, fig)
            finally:
                self.end_writers(inst, procs, ctl, fig)
        finally:
            ctl.close()
            ctl_path.unlink()
        if self.group is not None:
            for server in self.group.servers:  # a cycle cut short left one down
                if server.proc is None:
                    self.group.restart(server)
        elif self.redis is not None and self.redis.proc is None:
            self.redis.start()
            if self.outages and self.outages[-1][1] is None:
                self.outages[-1][1] = time.time()
        fig.redis_outages = len(self.outages)
        inst.start()
        evictions = []
        inst.cycle_logs = []
        for k in range(len(inst.nodes)):
            text = inst.new_log(k)
            inst.cycle_logs.append(text)
            found = evictions_in(text)
            if len(found) != text.count("pool full: evicting"):
                # a log line the parser does not read: its files would count as lost
                self.problem(f"node {k}: eviction lines the harness cannot read")
            evictions += found
        if evictions and inst is not self.small:
            fig.unexplained_evictions += len(evictions)
            self.problem(f"{len(evictions)} eviction(s) in the large pool")
        self.verify(inst, cdir, fig, evictions, scenario)
        if self.failover:
            self.check_extents(inst, fig)
        if scenario == "format":
            self.format_cycle(inst, fig)
        if not fig.failures:
            shutil.rmtree(cdir, ignore_errors=True)
        self.say(
            f"cycle {self.cycle} {scenario}: {fig.commits} commits, lost {fig.lost}, partial "
            f"{fig.partial}, resurrected {fig.resurrected}, stray {fig.stray}, evicted "
            f"{fig.evicted}, errors {fig.writer_errors} ({time.monotonic() - t0:.1f}s)"
        )
        return fig

    def run(self, cycles: int, minutes: float | None = None) -> dict:
        t0 = time.monotonic()
        total = Figures()
        try:
            self._cycles(cycles, minutes, t0, total)
        except KeyboardInterrupt:  # SIGINT, or SIGTERM (see main): report what ran
            self.problems.append(f"interrupted during cycle {self.cycle} (not counted)")
        finally:
            self.close()
        seconds = time.monotonic() - t0
        waits = sorted(total.seen_after_ms)

        def q(f: float) -> float | None:
            return waits[min(len(waits) - 1, int(f * len(waits)))] if waits else None

        staleness = {
            "waits": len(waits),
            "p50_ms": q(0.5),
            "p99_ms": q(0.99),
            "max_ms": waits[-1] if waits else None,
            "bound_ms": STALE_BOUND_MS,
        }
        over = int(bool(waits) and waits[-1] > STALE_BOUND_MS)
        if over:
            self.problems.append(
                f"a change took {waits[-1]:.0f} ms to be seen on the other "
                f"node (bound {STALE_BOUND_MS} ms)"
            )
        return {
            "mode": "cluster" if self.cluster else "single",
            "durability": self.durability,
            "shards": self.shards,
            "window_bound_ms": self.window_ms,
            "max_lost_window_ms": max(total.lost_window_ms, default=0.0),
            "writers": self.writers,
            "seed": self.seed,
            **total.reported(),
            "max_seen_after_outage_ms": max(total.seen_after_outage_ms, default=None),
            "redis_grace_ms": REDIS_GRACE_MS,
            "max_redis_error_after_up_ms": max(total.redis_error_after_up_ms, default=None),
            "staleness": staleness,
            "stale_over_bound": over,
            **(
                {
                    "failover": {
                        "cycles": len(total.failover_ms),
                        "failover_ms": _spread(total.failover_ms),
                        "first_publish_ms": _spread(total.first_publish_ms),
                        "reads_in_outage_ok": total.reads_in_outage_ok,
                        "reads_in_outage_failed": total.reads_in_outage_failed,
                        "min_replicas": 1,
                        "replicas": 2,
                        "sentinels": 3,
                        "confirm": "all",
                        "follow_replicas": self.follow_replicas,
                        "down_after_ms": self.group.down_after_ms,
                        # failovers Sentinel made; more than `cycles`: it also replaced
                        # masters that were alive (a stall longer than down_after_ms)
                        "sentinel_failovers": self.group.switches(),
                    }
                }
                if self.failover
                else {}
            ),
            "seconds": round(seconds, 1),
            "cycles_per_minute": round(total.cycles / seconds * 60, 2) if seconds else 0,
            "scenarios": {
                k: {
                    **f.reported(),
                    "staleness_max_ms": max(f.seen_after_ms, default=None),
                }
                for k, f in self.figures.items()
            },
            "problems": self.problems[:100],
        }

    def _cycles(self, cycles: int, minutes: float | None, t0: float, total: Figures) -> None:
        for c in range(cycles):
            if minutes is not None and time.monotonic() - t0 > minutes * 60:
                break
            scenario = self.scenarios[c % len(self.scenarios)]
            try:
                fig = self.one_cycle(scenario)
            except (RuntimeError, TimeoutError, OSError) as e:  # kvfs no longer mounts, say
                self.problem(f"{scenario}: {str(e)[-1500:]}")
                # writers that crashed in it (end_writers saw them) still count
                fig = Figures(
                    cycles=1,
                    broken=1,
                    writer_failures=self.fig.writer_failures,
                    writer_failure_lines=self.fig.writer_failure_lines,
                )
                self.figures.setdefault(scenario, Figures()).add(fig)
                total.add(fig)
                break
            self.figures.setdefault(scenario, Figures()).add(fig)
            total.add(fig)
            with open(self.work / "cycles.jsonl", "a") as f:  # survives a crashed run
                f.write(
                    json.dumps({"cycle": self.cycle, "scenario": scenario, **fig.__dict__}) + "\n"
                )

    def close(self) -> None:
        for inst in (self.main, self.small):
            for n in inst.nodes:
                try:
                    n.stop(60)
                except Exception:  # noqa: BLE001 - clean up the rest
                    n.kill()
        if self.group is not None:
            self.group.stop()
        elif self.redis is not None:
            self.redis.stop()
        for x in self.shard_servers:
            x.stop()


def _spread(values: list) -> dict:
    """p50, p99 and max of `values` (None when empty)."""
    v = sorted(values)

    def q(f: float):
        return v[min(len(v) - 1, int(f * len(v)))] if v else None

    return {"n": len(v), "p50": q(0.5), "p99": q(0.99), "max": v[-1] if v else None}


def _cluster_lines(log_text: str, keep: int = 6) -> list[str]:
    """A node log's last `keep` warnings and errors about the shared catalog (what a
    divergence report needs to say which node lost track of what)."""
    lines = [
        ln.split(" ", 2)[-1]
        for ln in log_text.splitlines()
        if (" WARNING " in ln or " ERROR " in ln) and "cluster:" in ln
    ]
    return lines[-keep:]


def _seen(data) -> str:
    """What one node has under a name, in a line: absent, an error, or the version's header
    and size."""
    if data is None:
        return "absent"
    if not isinstance(data, bytes):
        return repr(data)
    head = data[: data.find(b">") + 1] if data.startswith(b"<") else data[:16]
    return f"{head.decode(errors='replace')} {len(data)} bytes"


def _digest(view: dict) -> dict:
    return {
        n: (hashlib.blake2b(d, digest_size=16).hexdigest() if isinstance(d, bytes) else repr(d))
        for n, d in view.items()
    }


def _compare(inst: Instance, name: str, data: bytes, versions) -> str:
    """How `data` differs from each of these versions: its size and the first differing byte."""
    out = []
    for v in sorted(versions):
        rec = inst.recipes.get(name, {}).get(v)
        if rec is None:
            continue
        want = build(rec)
        n = min(len(want), len(data))
        first = next(
            (i for i in range(0, n, 4096) if want[i : i + 4096] != data[i : i + 4096]), None
        )
        if first is not None:
            first += next(j for j in range(4096) if want[first + j] != data[first + j])
        zeros = data.count(0) if len(data) < 64 * MiB else -1
        out.append(
            f"v{v}: {len(want)} bytes, first difference at "
            f"{first if first is not None else min(len(want), len(data))}, zero bytes in"
            f" file {zeros}"
        )
    return "; ".join(out)


# --- command line --------------------------------------------------------------------------------
COLUMNS = [
    "cycles",
    "commits",
    "lost",
    "partial",
    "zero_byte",
    "resurrected",
    "stray",
    "evicted",
    "writer_errors",
    "unexplained_errors",
    "writer_failures",
    "broken",
    "hung",
    "unaimed",
]
# outcomes any one of which fails the run (and the short form's test)
FAILING = (
    "lost",
    "partial",
    "resurrected",
    "stray",
    "broken",
    "hung",
    "divergent",
    "unexplained_evictions",
    "unexplained_errors",
    "stale_views",
    "stale_over_bound",
    "writer_failures",
    "shared_extents",
)


def table(report: dict) -> str:
    rows = [["scenario", *COLUMNS]]
    for name, f in report["scenarios"].items():
        rows.append([name, *[str(f[c]) for c in COLUMNS]])
    rows.append(["total", *[str(report[c]) for c in COLUMNS]])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
        for r in rows
    ]
    head = (
        f"kvfs torture ({report['mode']}, durability {report['durability']}, "
        f"{report['writers']} writers, seed {report['seed']}): "
        f"{report['cycles']} cycles in {report['seconds']} s "
        f"({report['cycles_per_minute']} per minute)"
    )
    tail = []
    if report["format_outcomes"]:
        tail.append(
            "format outcomes: "
            + ", ".join(f"{k} {v}" for k, v in report["format_outcomes"].items())
        )
    if report["durability"] == "fsync":
        tail.append(
            f"closes rolled back by a crash (within the write-back window): "
            f"{report['lost_in_window']}; the oldest "
            f"{report['max_lost_window_ms']} ms before its kill (bound "
            f"{report['window_bound_ms']:.0f} ms)"
        )
    tail.append(
        "writer errors by errno: "
        + (", ".join(f"{k} {v}" for k, v in sorted(report["errnos"].items())) or "none")
    )
    if report["redis_outages"]:
        tail.append(
            f"Redis outages {report['redis_outages']}: errors while it was up "
            f"{report['redis_errors_outside']}, the latest excused one "
            f"{report['max_redis_error_after_up_ms']} ms after the restart (grace "
            f"{report['redis_grace_ms']} ms)"
        )
    fo = report.get("failover")
    if fo:
        f, p = fo["failover_ms"], fo["first_publish_ms"]
        tail.append(
            f"failovers {fo['cycles']}: the kill to a promoted master p50 {f['p50']} ms, "
            f"max {f['max']} ms; to the first publish p50 {p['p50']} ms, p99 {p['p99']} "
            f"ms, max {p['max']} ms; reads meanwhile {fo['reads_in_outage_ok']} ok, "
            f"{fo['reads_in_outage_failed']} failed; extents claimed twice "
            f"{report['shared_extents']}"
        )
    st = report["staleness"]
    if st["waits"]:
        tail.append(
            f"changes seen on the other node after a wait: {st['waits']}, p50 "
            f"{st['p50_ms']} ms, p99 {st['p99_ms']} ms, max {st['max_ms']} ms (bound "
            f"{st['bound_ms']} ms)"
        )
    if report["unexplained_evictions"] or report["divergent"] or report["stale_views"]:
        tail.append(
            f"evictions in the large pool {report['unexplained_evictions']}, divergent "
            f"{report['divergent']}, stale views {report['stale_views']}"
        )
    tail += report["problems"][:30]
    return "\n".join([head, *lines, *tail])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cycles", type=int, default=200)
    p.add_argument("--writers", type=int, default=4)
    p.add_argument("--cluster", action="store_true")
    p.add_argument(
        "--failover",
        action="store_true",
        help="(implies --cluster) Redis behind Sentinel; kill -9 its master",
    )
    p.add_argument(
        "--follow-replicas",
        action="store_true",
        help="(--failover) the nodes' followers read from replicas ([cluster] follow_replicas)",
    )
    p.add_argument(
        "--durability",
        choices=["fsync", "close"],
        default="fsync",
        help="[mount] durability (a shared pool's too)",
    )
    p.add_argument(
        "--window-ms",
        type=float,
        default=WINDOW_BOUND_MS,
        help='("fsync") a close this long before the kill must survive it',
    )
    p.add_argument(
        "--shards",
        type=int,
        default=1,
        help="(--cluster) the catalog over this many Redis shards, the names in 4 directories "
        "per shard; the redis scenario kills any one of them",
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", action="store_true")
    p.add_argument("--scenarios", help="comma-separated, taken in turn")
    p.add_argument("--minutes", type=float, help="stop starting cycles after this long")
    p.add_argument(
        "--workdir",
        type=Path,
        help="keep everything here (default: a temporary "
        "directory, removed unless something failed)",
    )
    p.add_argument("--verbose", "-v", action="store_true")
    # the writer process
    p.add_argument("--writer", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--index", type=int, help=argparse.SUPPRESS)
    p.add_argument("--control", help=argparse.SUPPRESS)
    p.add_argument("--journal", help=argparse.SUPPRESS)
    p.add_argument("--state", help=argparse.SUPPRESS)
    p.add_argument("--mount", dest="mounts", action="append", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.writer:
        return writer_main(a)
    if a.shards > 1 and (a.failover or not a.cluster):
        p.error("--shards needs --cluster (and not --failover)")
    if os.geteuid() != 0 or not os.path.exists("/dev/fuse"):
        print("torture: needs root and /dev/fuse", file=sys.stderr)
        return 2

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    if a.follow_replicas and not a.failover:
        p.error("--follow-replicas needs --failover (followers read from Sentinel's replicas)")
    work = a.workdir or Path(tempfile.mkdtemp(prefix="kvfs-torture-"))
    work.mkdir(parents=True, exist_ok=True)
    scen = a.scenarios.split(",") if a.scenarios else None
    t = Torture(
        work,
        writers=a.writers,
        cluster=a.cluster,
        seed=a.seed,
        scenarios=scen,
        quiet=not a.verbose,
        durability=a.durability,
        window_ms=a.window_ms,
        failover=a.failover,
        follow_replicas=a.follow_replicas,
        shards=a.shards,
    )
    report = t.run(a.cycles, a.minutes)
    report["workdir"] = str(work)
    failed = sum(report[k] for k in FAILING)
    if not failed and a.workdir is None:
        shutil.rmtree(work, ignore_errors=True)
    print(dumps(report) if a.json else table(report))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
