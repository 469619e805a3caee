"""Group commit for the SQLite catalog (`GroupCommit`, an object SqliteCatalog holds as
`group`; see its module doc): the open transaction, the rounds that commit it and sync the WAL,
the failure that ends them, and the space waiting for a change to be durable.

Mutations are executed at once in the open transaction (`execute`), then wait for
durability (`durable`): the first waiter of a round commits the open transaction on the trio
thread (`synchronous=NORMAL` writes the WAL without syncing it) and fdatasyncs the WAL in a
worker thread; statements executed meanwhile go to the next transaction, served by the next
round. A failure of any step rolls back, sets `failure` and refuses every later change.

Before it commits, a round's first waiter lets the commits whose blocks are still being
written join it (`before_commit`, given at open: it returns once no commit is writing its
block, or after the time given): a round's WAL sync then serves a whole burst of closes rather
than the first of them alone, the next ones waiting a round behind it. The wait is bounded by
the recent duration of a WAL sync, which is what not waiting would cost them.

With `sync_changes` False (durability = "fsync", kvfs/write/writeback.py) a change to the tree (a
mkdir, an unlink, a rename...) returns once it is executed in the open transaction, as ext4
returns once its journal has the change in memory: transactions still reach the disk in the
order they were applied, so a crash keeps a prefix of the changes; the write-back flusher
commits the open transaction within its delay (`on_unsynced` tells it one was opened), and
fsync, fsyncdir and syncfs wait for it (`sync`). Space a change stopped referencing (a
deleted file's block) is freed only once the change is durable (`after_release`): a crash
before then finds the row still pointing at it, and its bytes must still be there.
"""

from __future__ import annotations

import errno
import logging
import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Awaitable, Callable

import trio

from kvfs import tasks
from kvfs.catalog.announce import Announcer
from kvfs.catalog.sqlite_schema import Stmt
from kvfs.errors import KvfsError

log = logging.getLogger("kvfs.catalog")

GROUP_WAIT_MAX = 0.005  # a round waits at most this long for commits still writing


@dataclass(frozen=True)
class CommitHooks:
    """What the group commit tells or asks the layers around it, given when the catalog is
    opened (kvfs/service.py; the calls that go up pass through its seams)."""

    # a change to the tree waits for durability (False: durability = "fsync", write-back)
    sync_changes: bool = True
    # before_commit(seconds): return once no commit is writing its block, or after that long
    before_commit: Callable[[float], Awaitable[None]] | None = None
    # on_unsynced(): a transaction was opened (the write-back flusher commits it in time)
    on_unsynced: Callable[[], None] | None = None
    # on_failure(why): the catalog can no longer make changes durable (the pool frees nothing)
    on_failure: Callable[[str], None] | None = None
    # told of durable changes to the names it recognises (KV events, kvfs/catalog/announce.py)
    announcer: Announcer | None = None


class GroupCommit:
    """The open transaction over the catalog's connection and the rounds that make it durable.
    The catalog executes its statements here (`execute`, `execute_many`: their transaction's
    number) and waits for them (`durable`, `persist`, `change`, `sync`); `synced` and `txn` say
    which transaction is durable and which one a change made now goes to, `on_synced` (the
    catalog's: its KV events) is called after each WAL sync. Once a write failed, `failure`
    says why and every later change is refused."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        path: Path,
        hooks: CommitHooks,
        on_synced: Callable[[], None],
    ) -> None:
        self._conn = conn
        self.path = path
        self._on_synced = on_synced
        # why changes can no longer be made durable (a write failed), until a restart
        self.failure: str | None = None
        self.commits = 0  # durable transactions (for statistics)
        self.statements = 0
        self.commit_seconds = 0.0  # time spent making changes durable
        self._in_txn = False
        self._txn = 1  # the transaction statements go to (open or next)
        self._committed = 0  # the last transaction committed (in the WAL)
        self._synced = 0  # the last transaction durable (WAL synced)
        self._syncing = False
        self._round: trio.Event | None = None
        self._wal_fd: int | None = None
        self.syncs = 0  # WAL fdatasyncs (for statistics)
        self.before_commit = hooks.before_commit
        self._sync_estimate = 0.0  # recent duration of a WAL sync (seconds)
        self.sync_changes = hooks.sync_changes
        self.on_unsynced = hooks.on_unsynced
        self.on_failure = hooks.on_failure
        self._txn_began = 0.0  # trio time the open transaction began
        # the transaction whose durability frees the space released last (a row deleted, or
        # pointed at a new block); callbacks waiting for it (`after_release`)
        self._release_mark = 0
        self._after: list[tuple[int, Callable[[], None]]] = []
        self.sql_seconds = 0.0  # COMMITs on the trio thread
        self.sync_seconds = 0.0  # WAL syncs (in a worker thread)

    def _fail(self, e: BaseException) -> None:
        """A write failed: roll back the open transaction and refuse every later change
        (`failure`); the first time, log it and tell whoever opened the catalog (`on_failure`:
        the pool then frees no extent until a restart)."""
        if self._conn.in_transaction:
            try:
                self._conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass
        self._in_txn = False
        if self.failure:
            return
        self.failure = (
            f"catalog {self.path}: a write failed ({e}); refusing changes until kvfs is restarted"
        )
        log.error(self.failure)
        if self.on_failure is not None:
            self.on_failure(self.failure)

    def execute(self, stmts: list[Stmt]) -> int:
        """Run statements in the open transaction (opening one); return its number."""
        return self._in_open_transaction(
            [(self._conn.execute, sql, params) for sql, params in stmts]
        )

    def execute_many(self, batches: list[tuple[str, list[tuple]]]) -> int:
        """Run each statement once per parameter tuple (executemany) in the open transaction;
        return its number."""
        return self._in_open_transaction(
            [(self._conn.executemany, sql, rows) for sql, rows in batches if rows],
            count=sum(len(rows) for _, rows in batches),
        )

    def _in_open_transaction(self, calls: list, count: int | None = None) -> int:
        """Make the calls (method, sql, parameters) in the open transaction, opening one; a
        failure rolls back and refuses every later change (`_fail`). Returns the
        transaction's number."""
        if self.failure:
            raise KvfsError(errno.EIO, self.failure)
        try:
            if not self._in_txn:
                self._conn.execute("BEGIN")
                self._in_txn = True
                self._txn_began = trio.current_time()
                if self.on_unsynced is not None:
                    self.on_unsynced()
            for call, sql, params in calls:
                call(sql, params)
        except sqlite3.Error as e:
            self._fail(e)
            raise KvfsError(errno.EIO, f"catalog write failed: {e}") from None
        self.statements += len(calls) if count is None else count
        return self._txn

    async def persist(self, stmts: list[Stmt]) -> None:
        """Apply statements now (every later query sees them); return once they are durable."""
        await self.durable(self.execute(stmts))

    async def change(self, stmts: list[Stmt]) -> None:
        """A change to the tree: applied now; durable on return when `sync_changes`, else
        with the next round (see the module doc)."""
        txn = self.execute(stmts)
        if self.sync_changes:
            await self.durable(txn)

    @property
    def unsynced(self) -> bool:
        """Changes were applied that are not durable yet."""
        return self._in_txn or self._committed > self._synced

    @property
    def open_since(self) -> float | None:
        """The trio time the open transaction began (None: none is open)."""
        return self._txn_began if self._in_txn else None

    @property
    def txn(self) -> int:
        """The transaction a change made now goes to: the open one, or the next (its
        statements follow without a yield)."""
        return self._txn

    @property
    def synced(self) -> int:
        """The last transaction durable."""
        return self._synced

    def mark_release(self) -> None:
        """A change made now stops referencing space (a row deleted, or pointed at a new
        block): the space is free once its transaction is durable (`after_release`)."""
        self._release_mark = self._txn

    def after_release(self, fn: Callable[[], None]) -> None:
        """Call fn() once the change that released space last is durable (now, if it is):
        the space layer frees a retired block's extents through this. Never called after a
        failure (the pool frees nothing more then: `on_failure`)."""
        if self._release_mark <= self._synced:
            fn()
        else:
            self._after.append((self._release_mark, fn))

    def _run_after(self) -> None:
        due = [fn for txn, fn in self._after if txn <= self._synced]
        if due:
            self._after = [(txn, fn) for txn, fn in self._after if txn > self._synced]
            for fn in due:
                fn()

    async def durable(self, txn: int) -> None:
        """Wait until transaction `txn` is committed and a WAL sync that started after its
        commit has completed (the first waiter of a round does the work; see the module doc)."""
        with trio.CancelScope(shield=True):
            while self._synced < txn:
                if self.failure:
                    raise KvfsError(errno.EIO, self.failure)
                if self._syncing:
                    await self._round.wait()
                    continue
                self._syncing = True
                self._round = trio.Event()
                try:
                    if self.before_commit is not None and self._sync_estimate > 0:
                        await self.before_commit(min(GROUP_WAIT_MAX, self._sync_estimate))
                    await self._commit_round()
                finally:
                    self._syncing = False
                    self._round.set()
            if self.failure and self._synced < txn:
                raise KvfsError(errno.EIO, self.failure)

    async def _commit_round(self) -> None:
        t = time.perf_counter()
        if self._in_txn:
            try:
                self._conn.execute("COMMIT")
            except sqlite3.Error as e:
                self._fail(e)
                return
            self.sql_seconds += time.perf_counter() - t
            self._in_txn = False
            self._committed = self._txn
            self._txn += 1
            self.commits += 1
        target = self._committed
        if target > self._synced:
            t1 = time.perf_counter()
            try:
                await tasks.run_sync(self._sync_wal)
            except OSError as e:
                self._fail(e)
                return
            self._synced = target
            self.syncs += 1
            self._run_after()
            self._on_synced()
            took = time.perf_counter() - t1
            self.sync_seconds += took
            self._sync_estimate = (
                took if not self._sync_estimate else 0.8 * self._sync_estimate + 0.2 * took
            )
        self.commit_seconds += time.perf_counter() - t

    def _sync_wal(self) -> None:
        """In a worker thread: fdatasync the WAL (reopened if SQLite made a new one)."""
        wal = str(self.path) + "-wal"
        fd = self._wal_fd
        if fd is not None and os.fstat(fd).st_ino != os.stat(wal).st_ino:
            os.close(fd)
            fd = self._wal_fd = None
        if fd is None:
            fd = self._wal_fd = os.open(wal, os.O_RDONLY | os.O_CLOEXEC)
            d = os.open(os.path.dirname(wal) or ".", os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(d)  # the WAL's directory entry, once
            finally:
                os.close(d)
        os.fdatasync(fd)

    async def sync(self) -> None:
        """Make everything applied so far durable."""
        await self.durable(self._txn if self._in_txn else self._committed)

    def close(self) -> None:
        """Commit what is open (unless a write failed) and close the WAL's descriptor; the
        catalog closes the connection, and SQLite checkpoints the WAL."""
        if self._in_txn and not self.failure:
            try:
                self._conn.execute("COMMIT")
            except sqlite3.Error as e:
                log.error("catalog %s: the last commit failed: %s", self.path, e)
            self._in_txn = False
        if self._wal_fd is not None:
            os.close(self._wal_fd)
            self._wal_fd = None
