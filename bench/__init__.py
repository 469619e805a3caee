"""Benchmarks (each file is a script: `python bench/<name>.py --help`). `dumps` is how each writes
its --json: the result with where it comes from, so that a figure cited from bench/results/ can
be traced to the code that measured it. `parser` and `parse` are each bench's command line."""

from __future__ import annotations

import argparse
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

    return {
        "commit": git("rev-parse", "HEAD") or None,
        "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        "argv": [Path(sys.argv[0]).name, *sys.argv[1:]],
        "measured_at": _utc_now(),
    }


# Taken when the bench starts (every bench imports this package first): the commit it runs,
# not the one checked out when it ends.
STARTED = provenance()


def dumps(result: dict) -> str:
    """`result` as JSON, after its provenance (a key of the result's own wins)."""
    return json.dumps({**STARTED, "finished_at": _utc_now(), **result})


def parser(doc: str | None) -> argparse.ArgumentParser:
    """A bench's command line: --help shows `doc` (the module's docstring) as written."""
    return argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )


def parse(ap: argparse.ArgumentParser, argv: list[str] | None, needs=None) -> argparse.Namespace:
    """The bench's arguments, `--json` (print one JSON object, `dumps`) added last. Then
    `needs(args)` says why this machine cannot run the bench, or None; by default
    testing/emulate.py's `available()` (root, loop devices, a device throttle). Where it says
    why, the bench stops here: `bench/<name>.py: why` on stderr, exit status 2."""
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if needs is None:
        from testing.emulate import available

        why = available()
    else:
        why = needs(args)
    if why:
        ap.exit(2, f"bench/{ap.prog}: {why}\n")
    return args
