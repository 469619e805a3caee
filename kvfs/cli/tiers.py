"""kvfs pin, unpin, evict, warm: steer what kvfs keeps in its fast tiers."""

from __future__ import annotations

import argparse
import os
import sys
import time

from kvfs.cli.common import CliError, control, emit, find_mount, with_json


def _mount_rel(paths: list[str]) -> tuple[str, list[str]]:
    """The one kvfs mount that holds all `paths`, and their paths from its root."""
    mounts = {find_mount(p) for p in paths}
    if len(mounts) > 1:
        raise CliError(f"the files are on different kvfs mounts: {', '.join(sorted(mounts))}")
    mount = mounts.pop()
    rels = []
    for p in paths:
        if not os.path.isfile(p):
            raise CliError(
                f"not a regular file: {p}"
                if os.path.exists(p)
                else f"no such file or directory: {p}"
            )
        rels.append("/" + os.path.relpath(os.path.realpath(p), mount))
    return mount, rels


def cmd_pin(args: argparse.Namespace, on: bool = True) -> int:
    out = []
    for p in args.files:
        _mount_rel([p])
        try:
            if on:
                os.setxattr(p, "user.kvfs.pin", b"1")
            else:
                os.setxattr(p, "user.kvfs.pin", b"0")
        except OSError as e:
            raise CliError(
                f"{'pin' if on else 'unpin'} {p}: {e.strerror}"
                + (" (the DRAM tier cannot hold it pinned)" if e.errno == 28 else "")
            )
        out.append({"path": p, "pinned": on, "tier": os.getxattr(p, "user.kvfs.tier").decode()})
    emit(
        args.json,
        out,
        lambda o: "\n".join(
            f"{'pinned' if on else 'unpinned'} {x['path']} ({x['tier']})" for x in o
        ),
    )
    return 0


def cmd_unpin(args: argparse.Namespace) -> int:
    return cmd_pin(args, on=False)


def cmd_evict(args: argparse.Namespace) -> int:
    if bool(args.files) == (args.cold is not None):
        raise CliError("evict takes FILE... or --cold N", 2)
    if args.cold is not None:
        mount = find_mount(args.mount)
        res = control(mount, "evict", {"cold": args.cold})
    else:
        mount, rels = _mount_rel(args.files)
        res = control(mount, "evict", {"paths": rels})
    emit(
        args.json,
        res,
        lambda r: (
            f"evicted {len(r['evicted'])} block(s), "
            f"{r['bytes']} bytes, from the fast tiers of {mount}"
        ),
    )
    return 0


def _bar(done: int, total: int, width: int = 30) -> str:
    n = int(width * done / total) if total else width
    return f"[{'#' * n}{'.' * (width - n)}] {done}/{total}"


def cmd_warm(args: argparse.Namespace) -> int:
    mount, rels = _mount_rel([args.file])
    res = control(mount, "warm", {"path": rels[0], "depth": args.depth})
    paths = [os.path.join(mount, p.lstrip("/")) for p in res["blocks"]]
    deadline = time.monotonic() + args.timeout
    show = sys.stderr.isatty() and not args.json
    while True:
        tiers = []
        for p in paths:
            try:
                tiers.append(os.getxattr(p, "user.kvfs.tier").decode())
            except OSError:
                tiers.append("gone")
        done = sum(t == "dram" for t in tiers)
        if show:
            sys.stderr.write(f"\rwarming {args.file}: {_bar(done, len(paths))}")
            sys.stderr.flush()
        if done == len(paths) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    if show:
        sys.stderr.write("\n")
    out = {
        "blocks": [{"path": p, "tier": t} for p, t in zip(paths, tiers)],
        "resident": done,
        "total": len(paths),
    }
    emit(args.json, out, lambda o: f"{o['resident']} of {o['total']} block(s) of the chain in DRAM")
    return 0 if done == len(paths) else 1


def add_parsers(sub) -> None:
    p = with_json(sub.add_parser("pin", help="keep files' blocks in DRAM until unpinned"))
    p.add_argument("files", nargs="+")
    p.set_defaults(func=cmd_pin)

    p = with_json(sub.add_parser("unpin", help="let pinned blocks leave DRAM again"))
    p.add_argument("files", nargs="+")
    p.set_defaults(func=cmd_unpin)

    p = with_json(sub.add_parser("evict", help="drop blocks from the fast tiers (DRAM, local)"))
    p.add_argument("files", nargs="*")
    p.add_argument("--cold", type=int, metavar="N", help="the N coldest DRAM blocks instead")
    p.add_argument("--mount", default=".", help="the mount, with --cold")
    p.set_defaults(func=cmd_evict)

    p = with_json(sub.add_parser("warm", help="fetch a file and the chain after it into DRAM"))
    p.add_argument("file")
    p.add_argument("--depth", type=int, default=64, help="blocks of the chain after FILE")
    p.add_argument("--timeout", type=float, default=60.0)
    p.set_defaults(func=cmd_warm)
