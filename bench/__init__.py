"""Benchmarks (each file is a script: `python bench/<name>.py --help`). `dumps` is how each writes
its --json: the result with where it comes from, so that a figure cited from bench/results/ can
be traced to the code that measured it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def provenance() -> dict:
    """The commit measured (`dirty`: the work tree had changes to tracked files), the command
    line and the time (UTC), as of now."""
    def git(*args: str) -> str:
        r = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
        return r.stdout.strip() if r.returncode == 0 else ""
    return {"commit": git("rev-parse", "HEAD") or None,
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
            "argv": [Path(sys.argv[0]).name, *sys.argv[1:]],
            "measured_at": _utc_now()}


# Taken when the bench starts (every bench imports this package first): the commit it runs,
# not the one checked out when it ends.
STARTED = provenance()


def dumps(result: dict) -> str:
    """`result` as JSON, after its provenance (a key of the result's own wins)."""
    return json.dumps({**STARTED, "finished_at": _utc_now(), **result})
