"""The `kvfs` command.

    kvfs mount | umount | format          run a mount (kvfs/cli/mounting.py)
    kvfs stat | ls | tree | df | du | top inspect it (kvfs/cli/inspect.py)
    kvfs pin | unpin | evict | warm        steer it (kvfs/cli/tiers.py)
    kvfs pool show | remove | add          its namespaces (kvfs/cli/pool.py)
    kvfs doctor                            check the node (kvfs/cli/doctor.py)
    kvfs events                            print its KV events (kvfs/cli/events.py)

Every entry point is `main(argv)`, so tests call it in-process. Every command prints tables for
people and, with --json, one JSON document for scripts. Exit status: 0 success, 1 a refused
request or a failed check (the error is one line on stderr naming the problem), 2 bad usage.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from kvfs import __version__
from kvfs.cli import doctor, events, inspect, mounting, pool, tiers
from kvfs.cli.common import CliError, fail
from kvfs.errors import KvfsError


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvfs", description="KV-cache blocks as files.")
    p.add_argument("--version", action="version", version=f"kvfs {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    mounting.add_parsers(sub)
    inspect.add_parsers(sub)
    tiers.add_parsers(sub)
    pool.add_parsers(sub)
    doctor.add_parsers(sub)
    events.add_parsers(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (KvfsError, CliError) as e:
        return fail(str(e), e.code if isinstance(e, CliError) else 1)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        sys.stderr.close()
        return 0
