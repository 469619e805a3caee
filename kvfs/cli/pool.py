"""`kvfs pool`: the pool's namespaces and their health, and a namespace removed or added while
mounted (issue 58; the daemon's side is kvfs/fs/pool_admin.py).

    kvfs pool show MNT                   each namespace: state, reads, space, errors
    kvfs pool remove MNT N [--drop]      take namespace N out (its blocks are dropped)
    kvfs pool add MNT PATH [--size S]    format PATH as the next namespace and use it
"""

from __future__ import annotations

import argparse

from kvfs.cli.common import control, emit, size, stats, table, with_json
from kvfs.units import parse_size


def _show(s: dict) -> str:
    rows = []
    weights = s["tiers"]["pool"].get("placement_weights") or []
    for ns in s["namespaces"]:
        j = ns["index"]
        rows.append(
            [
                j,
                ns["path"],
                ns["state"],
                ns["read_state"],
                size(ns["used"]) if "used" in ns else "-",
                size(ns["size"]),
                f"{weights[j]:.2f}" if j < len(weights) else "-",
                ns["errors"],
                ns["read_timeouts"],
                ns["reads_refused"],
                ns["last_error"][:60],
            ]
        )
    return table(
        [
            "NS",
            "PATH",
            "STATE",
            "READS",
            "USED",
            "SIZE",
            "WEIGHT",
            "ERRORS",
            "LATE",
            "REFUSED",
            "LAST ERROR",
        ],
        rows,
        right="NS,USED,SIZE,WEIGHT,ERRORS,LATE,REFUSED",
    )


def cmd_pool(args: argparse.Namespace) -> int:
    s = stats(args.mount)
    emit(args.json, s["namespaces"], lambda _: _show(s))
    return 0


def cmd_remove(args: argparse.Namespace) -> int:
    res = control(args.mount, "pool_remove", {"namespace": args.namespace, "drop": args.drop})
    emit(
        args.json,
        res,
        lambda r: (
            f"namespace {r['removed']} ({r['path']}) removed: "
            f"{r['dropped_files']} file(s), {size(r['dropped_bytes'])} dropped"
        ),
    )
    return 0


def cmd_add(args: argparse.Namespace) -> int:
    res = control(
        args.mount,
        "pool_add",
        {"path": args.path, "size": args.size, "force": args.force},
    )
    emit(args.json, res, lambda r: f"namespace {r['added']} ({r['path']}) added: {size(r['size'])}")
    return 0


def add_parsers(sub) -> None:
    p = sub.add_parser("pool", help="the pool's namespaces: show, remove or add one")
    verbs = p.add_subparsers(dest="verb", required=True)
    s = with_json(verbs.add_parser("show", help="each namespace's state, reads and space"))
    s.add_argument("mount", nargs="?", default=".")
    s.set_defaults(func=cmd_pool)
    r = with_json(verbs.add_parser("remove", help="take a namespace out while mounted"))
    r.add_argument("mount")
    r.add_argument("namespace", type=int)
    r.add_argument(
        "--drop",
        action="store_true",
        help="drop its blocks even while they still read (a cache: engines recompute them)",
    )
    r.set_defaults(func=cmd_remove)
    a = with_json(verbs.add_parser("add", help="format a path as the next namespace and use it"))
    a.add_argument("mount")
    a.add_argument("path")
    a.add_argument("--size", type=parse_size, help="create a file of this size (e.g. 4GiB)")
    a.add_argument("--force", action="store_true", help="overwrite a signature found there")
    a.set_defaults(func=cmd_add)
