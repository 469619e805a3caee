"""bench/torture.py excuses a file that kvfs evicted under pool pressure by reading the
daemon's log: the line kvfs/fs/eviction.py writes, in the daemon's format
(kvfs/cli/mounting.py), must be one the harness reads. When the package moved into
subpackages the logger's name changed (kvfs.files -> kvfs.fs.files), the pattern stopped
matching, and every eviction was counted as a lost file."""

from __future__ import annotations

import io
import logging

from bench.torture import evictions_in
from kvfs.cli.mounting import LOG_FORMAT
from kvfs.fs import eviction


def test_the_harness_reads_the_daemons_eviction_lines():
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    logger = eviction.log  # the logger that writes "pool full: evicting"
    logger.addHandler(handler)
    old_level, logger.level = logger.level, logging.INFO
    try:
        logger.info("pool full: evicting %s (%d bytes)", "/w0f1", 1962)
    finally:
        logger.removeHandler(handler)
        logger.level = old_level
    text = out.getvalue()
    assert "pool full: evicting /w0f1 (1962 bytes)" in text
    found = evictions_in(text)
    assert [(e.name, e.size) for e in found] == [("w0f1", 1962)], text
