"""The catalog's write-ahead log is checked before SQLite opens it: a log cut short is reported
(SQLite would silently drop the changes after its last intact commit)."""

from __future__ import annotations

import shutil
import sqlite3

from kvfs.catalog.sqlite_schema import wal_damage


def _wal_copy(tmp_path):
    """A WAL-mode database with a few commits, copied while open (as after kill -9)."""
    db = sqlite3.connect(tmp_path / "live.sqlite", isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA wal_autocheckpoint=0")
    db.execute("CREATE TABLE t (x BLOB)")
    for i in range(20):
        db.execute("INSERT INTO t VALUES (?)", (bytes(3000),))
    shutil.copy(tmp_path / "live.sqlite", tmp_path / "c.sqlite")
    shutil.copy(tmp_path / "live.sqlite-wal", tmp_path / "c.sqlite-wal")
    db.close()
    return tmp_path / "c.sqlite"


def test_an_intact_log_is_fine_and_a_truncated_one_is_reported(tmp_path):
    path = _wal_copy(tmp_path)
    wal = tmp_path / "c.sqlite-wal"
    assert wal_damage(path) is None
    assert wal_damage(tmp_path / "none.sqlite") is None
    size = wal.stat().st_size
    with open(wal, "r+b") as f:
        f.truncate(size // 2 + 100)
    msg = wal_damage(path)
    assert msg is not None and "partial frame" in msg and str(wal) in msg
    # and SQLite indeed opens it without a word, with fewer rows
    db = sqlite3.connect(path)
    assert db.execute("SELECT count(*) FROM t").fetchone()[0] < 20
    db.close()


def test_a_log_with_a_torn_header_is_reported(tmp_path):
    path = _wal_copy(tmp_path)
    with open(tmp_path / "c.sqlite-wal", "r+b") as f:
        f.write(b"\0" * 8)
    assert "no valid header" in wal_damage(path)
