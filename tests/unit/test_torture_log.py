"""bench/torture.py excuses a file that kvfs evicted under pool pressure by reading the
daemon's log: the line kvfs/fs/eviction.py writes, in the daemon's format
(kvfs/cli/mounting.py), must be one the harness reads. When the package moved into
subpackages the logger's name changed (kvfs.files -> kvfs.fs.files), the pattern stopped
matching, and every eviction was counted as a lost file."""

from __future__ import annotations

import ast
import inspect
import logging

from bench.torture import evictions_in
from kvfs.cli.mounting import LOG_FORMAT
from kvfs.fs import eviction


def _eviction_message() -> str:
    """The format string eviction.py logs an eviction with (read from its source)."""
    for node in ast.walk(ast.parse(inspect.getsource(eviction))):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "info"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and "evicting" in str(node.args[0].value)
        ):
            return node.args[0].value
    raise AssertionError("kvfs/fs/eviction.py logs no eviction")


def test_the_harness_reads_the_daemons_eviction_lines():
    # the record as the daemon's logger makes it, formatted as the daemon's handler does
    record = eviction.log.makeRecord(
        eviction.log.name,
        logging.INFO,
        eviction.__file__,
        0,
        _eviction_message(),
        ("/w0f1", 1962),
        None,
    )
    line = logging.Formatter(LOG_FORMAT).format(record)
    assert "pool full: evicting /w0f1 (1962 bytes)" in line, line
    found = evictions_in(line)
    assert [(e.name, e.size) for e in found] == [("w0f1", 1962)], line
