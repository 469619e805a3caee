"""kvfs stat, ls, tree, df, du, top: what kvfs holds and how it is doing, from a shell."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from typing import Any

from kvfs.cli.common import (
    CliError,
    emit,
    file_attrs,
    find_mount,
    pct,
    size,
    stats,
    table,
    with_json,
)

TIERS = ("dram", "local", "pool")


# --- stat ------------------------------------------------------------------------------------
def _when(ns: int) -> str:
    return datetime.datetime.fromtimestamp(ns / 1e9).strftime("%Y-%m-%d %H:%M:%S")


def _extents(layout: dict) -> str:
    return " ".join(f"ns{e[0]}@{e[1]}+{e[2]}" for e in layout.get("extents", []))


def cmd_stat(args: argparse.Namespace) -> int:
    out = [file_attrs(p) for p in args.files]

    def human(items: list[dict]) -> str:
        blocks = []
        for a in items:
            lay = a["layout"]
            blocks.append(
                "\n".join(
                    [
                        f"  File: {a['path']}",
                        f"  Size: {a['size']} ({size(a['size'])})   Tier: {a['tier']}   "
                        f"Pinned: {'yes' if a['pinned'] else 'no'}",
                        f"  Hits: {a['hits']}   Last access: {_when(a['atime_ns'])}",
                        f"  Generation: {lay.get('generation', '-')}   "
                        f"Checksum: {lay.get('checksum', '-')}   "
                        "Stripe unit: "
                        f"{size(lay['stripe_unit']) if 'stripe_unit' in lay else '-'}",
                        f"  Namespaces: {','.join(map(str, lay.get('namespaces', []))) or '-'}   "
                        f"Extents: {_extents(lay) or '-'}",
                        f"  Chain: parent {a['chain']['parent'] or '-'}   "
                        f"next {a['chain']['next'] or '-'}",
                    ]
                )
            )
        return "\n".join(blocks)

    emit(
        args.json,
        out if len(out) > 1 else out[0],
        lambda o: human(o if isinstance(o, list) else [o]),
    )
    return 0


# --- ls --------------------------------------------------------------------------------------
def _entries(directory: str) -> list[dict]:
    find_mount(directory)
    if not os.path.isdir(directory):
        raise CliError(f"not a directory: {directory}")
    out = []
    with os.scandir(directory) as it:
        for e in sorted(it, key=lambda e: e.name):
            st = e.stat(follow_symlinks=False)
            item: dict[str, Any] = {"name": e.name, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
            if e.is_dir(follow_symlinks=False):
                item["type"], item["tier"] = "dir", "-"
            elif e.is_symlink():
                item["type"], item["tier"] = "symlink", "-"
            else:
                item["type"] = "file"
                item["tier"] = os.getxattr(e.path, "user.kvfs.tier").decode()
                item["hits"] = int(os.getxattr(e.path, "user.kvfs.hits"))
            out.append(item)
    return out


def cmd_ls(args: argparse.Namespace) -> int:
    items = _entries(args.dir)

    def human(items: list[dict]) -> str:
        if not args.long:
            return "\n".join(
                f"{i['tier']:<6} {i['name']}{'/' if i['type'] == 'dir' else ''}" for i in items
            )
        rows = [
            [
                i["tier"],
                size(i["size"]) if i["type"] == "file" else "-",
                i.get("hits", "-"),
                _when(i["mtime_ns"]),
                i["name"] + ("/" if i["type"] == "dir" else ""),
            ]
            for i in items
        ]
        return table(["TIER", "SIZE", "HITS", "MODIFIED", "NAME"], rows, right="SIZE,HITS")

    emit(args.json, items, human)
    return 0


# --- tree ------------------------------------------------------------------------------------
def chains(directory: str) -> tuple[list[str], dict[str, list[str]], dict[str, dict]]:
    """The learned prefix chains among the files of a directory: (roots, children, info)."""
    mount = find_mount(directory)
    rel = "/" + os.path.relpath(os.path.realpath(directory), mount).strip(".").strip("/")
    rel = rel.rstrip("/")
    info: dict[str, dict] = {}
    for item in _entries(directory):
        if item["type"] != "file":
            continue
        path = f"{rel}/{item['name']}" if rel else f"/{item['name']}"
        chain = json.loads(os.getxattr(os.path.join(directory, item["name"]), "user.kvfs.chain"))
        info[path] = {
            "name": item["name"],
            "tier": item["tier"],
            "size": item["size"],
            "parent": chain["parent"],
        }
    children: dict[str, list[str]] = {p: [] for p in info}
    roots = []
    for path, i in info.items():
        parent = i["parent"]
        if parent in info and parent != path:
            children[parent].append(path)
        else:
            roots.append(path)
    # a cycle (a file is its chain's own ancestor) has no root: break it at its first file
    reached = set()
    stack = list(roots)
    while stack:
        p = stack.pop()
        if p not in reached:
            reached.add(p)
            stack.extend(children[p])
    for p in sorted(info):
        if p not in reached:
            roots.append(p)
            stack = [p]
            while stack:
                q = stack.pop()
                if q not in reached:
                    reached.add(q)
                    stack.extend(children[q])
    return sorted(roots), {k: sorted(v) for k, v in children.items()}, info


def cmd_tree(args: argparse.Namespace) -> int:
    roots, children, info = chains(args.dir)

    def as_json(p: str, seen: set) -> dict:
        seen.add(p)
        i = info[p]
        return {
            "name": i["name"],
            "tier": i["tier"],
            "size": i["size"],
            "next": [as_json(c, seen) for c in children[p] if c not in seen],
        }

    if args.json:
        seen: set = set()
        print(json.dumps([as_json(r, seen) for r in roots]))
        return 0
    lines: list[str] = []
    seen: set = set()

    def label(p: str) -> str:
        i = info[p]
        return f"{i['name']}  [{i['tier']} {size(i['size'])}]"

    def walk(p: str, prefix: str) -> None:
        # a chain continues on the next line at the same indentation; it branches with ├─/└─
        seen.add(p)
        kids = [c for c in children[p] if c not in seen]
        while len(kids) == 1:
            p = kids[0]
            seen.add(p)
            lines.append(f"{prefix}↳ {label(p)}")
            kids = [c for c in children[p] if c not in seen]
        for n, c in enumerate(kids):
            last = n == len(kids) - 1
            lines.append(f"{prefix}{'└─' if last else '├─'} {label(c)}")
            walk(c, prefix + ("   " if last else "│  "))

    for r in roots:
        lines.append(label(r))
        walk(r, "")
    nchains = len(roots)
    lines.append(f"\n{len(info)} block(s) in {nchains} chain(s)")
    print("\n".join(lines))
    return 0


# --- df / du ---------------------------------------------------------------------------------
def cmd_df(args: argparse.Namespace) -> int:
    mount = find_mount(args.mount)
    st = stats(mount)

    def human(st: dict) -> str:
        rows = []
        for name in TIERS:
            t = st["tiers"].get(name)
            if t is None:
                continue
            cap, used = t["capacity"], t["used"]
            rows.append(
                [
                    name,
                    size(cap),
                    size(used),
                    size(max(0, cap - used)),
                    pct(used, cap),
                    t.get("blocks", "-"),
                    t["hits"],
                    t["misses"],
                    pct(t["hits"], t["hits"] + t["misses"]),
                ]
            )
        out = f"kvfs at {mount}\n" + table(
            ["TIER", "CAPACITY", "USED", "FREE", "USE%", "BLOCKS", "HITS", "MISSES", "HIT%"],
            rows,
            right="CAPACITY,USED,FREE,USE%,BLOCKS,HITS,MISSES,HIT%",
        )
        c = st.get("cluster")
        if c:
            out += (
                f"\ncluster: node {c['node_id']}, Redis {c['redis']} "
                f"{'online' if c['online'] else 'UNREACHABLE'}, mirror "
                f"{'fresh' if c['fresh'] else 'STALE'} (lag {c['lag_seconds']:.1f} s), "
                f"regions leased {c['regions_held']}/{c['regions']}, waiting out grace "
                f"{size(c['grave_bytes'])} in {c['grave_blocks']} blocks, stores that "
                f"waited for room {c['room_waits']} ({c['room_wait_seconds']:.1f} s)"
            )
            if c.get("min_replicas") or c.get("failovers"):
                out += (
                    f"\nreplicas: {c['replicas_confirming']} confirm each change; failovers "
                    f"seen {c['failovers']}, changes no replica confirmed {c['unreplicated']}, "
                    f"waits for replicas {c['replica_waits']}, changes Redis refused "
                    f"{c['refused_writes']}"
                )
        return out

    if args.json:
        print(json.dumps({"mount": mount, "tiers": st["tiers"], "cluster": st.get("cluster")}))
    else:
        print(human(st))
    return 0


def cmd_du(args: argparse.Namespace) -> int:
    find_mount(args.path)
    per = {t: {"bytes": 0, "files": 0} for t in TIERS + ("write-buffer",)}
    paths = [args.path] if os.path.isfile(args.path) else None
    if paths is None:
        if not os.path.isdir(args.path):
            raise CliError(f"no such file or directory: {args.path}")
        paths = [os.path.join(d, f) for d, _, fs in os.walk(args.path) for f in fs]
    for p in paths:
        try:
            tier = os.getxattr(p, "user.kvfs.tier").decode()
            n = os.stat(p).st_size
        except OSError:
            continue  # gone meanwhile (evicted, unlinked)
        per.setdefault(tier, {"bytes": 0, "files": 0})
        per[tier]["bytes"] += n
        per[tier]["files"] += 1
    total = {
        "bytes": sum(v["bytes"] for v in per.values()),
        "files": sum(v["files"] for v in per.values()),
    }
    out = {"path": args.path, "tiers": {k: v for k, v in per.items() if v["files"]}, "total": total}

    def human(o: dict) -> str:
        rows = [[t, size(v["bytes"]), v["files"]] for t, v in o["tiers"].items()]
        rows.append(["total", size(total["bytes"]), total["files"]])
        return table(["TIER", "BYTES", "FILES"], rows, right="BYTES,FILES")

    emit(args.json, out, human)
    return 0


# --- top -------------------------------------------------------------------------------------
def sample(mount: str) -> dict:
    return {"t": time.monotonic(), "stats": stats(mount)}


def render_top(mount: str, prev: dict, cur: dict) -> dict:
    """Rates between two samples, as a JSON-friendly dict (what `kvfs top` shows)."""
    dt = max(1e-6, cur["t"] - prev["t"])
    a, b = prev["stats"], cur["stats"]
    tiers = {}
    for name in TIERS:
        if name not in b["tiers"]:
            continue
        x, y = a["tiers"].get(name, {}), b["tiers"][name]
        hits = y["hits"] - x.get("hits", 0)
        misses = y["misses"] - x.get("misses", 0)
        tiers[name] = {
            "capacity": y["capacity"],
            "used": y["used"],
            "hits_per_s": hits / dt,
            "misses_per_s": misses / dt,
            "hit_rate": hits / (hits + misses) if hits + misses else None,
            "in_bytes_per_s": (y["bytes_in"] - x.get("bytes_in", 0)) / dt,
            "out_bytes_per_s": (y["bytes_out"] - x.get("bytes_out", 0)) / dt,
        }
    namespaces = []
    for x, y in zip(a["namespaces"], b["namespaces"]):
        namespaces.append(
            {
                "index": y["index"],
                "path": y["path"],
                "state": y["state"],
                "read_state": y["read_state"],
                "read_timeouts": y["read_timeouts"],
                "read_bytes_per_s": (y["bytes_read"] - x["bytes_read"]) / dt,
                "write_bytes_per_s": (y["bytes_written"] - x["bytes_written"]) / dt,
                "inflight": y["inflight"],
                "errors": y["errors"],
            }
        )
    pa, pb = a["prefetch"], b["prefetch"]
    issued, used = pb["issued"] - pa["issued"], pb["used"] - pa["used"]
    return {
        "mount": mount,
        "pid": b["pid"],
        "uptime_s": b["uptime_s"],
        "interval_s": dt,
        "tiers": tiers,
        "namespaces": namespaces,
        "prefetch": {
            "issued_per_s": issued / dt,
            "used_per_s": used / dt,
            "wasted_per_s": (pb["wasted"] - pa["wasted"]) / dt,
            "accuracy": used / issued if issued else None,
            "accuracy_total": pb["used"] / pb["issued"] if pb["issued"] else None,
        },
        "latency": b.get("latency", {}),
    }


def namespaces_table(namespaces: list[dict]) -> str:
    """kvfs top's table of namespaces: STATE is the write side's, READS the read side's."""
    rows = [
        [
            n["index"],
            n["path"],
            n["state"],
            n["read_state"],
            n["read_timeouts"],
            f"{n['read_bytes_per_s'] / 1e6:.1f}",
            f"{n['write_bytes_per_s'] / 1e6:.1f}",
            n["inflight"],
            n["errors"],
        ]
        for n in namespaces
    ]
    heads = ["NS", "PATH", "STATE", "READS", "LATE", "READ MB/s", "WRITE MB/s"]
    return table(
        heads + ["INFLIGHT", "ERRORS"], rows, right="LATE,READ MB/s,WRITE MB/s,INFLIGHT,ERRORS"
    )


def top_text(v: dict) -> str:
    up = datetime.timedelta(seconds=int(v["uptime_s"]))
    lines = [f"kvfs top - {v['mount']}  pid {v['pid']}  up {up}  every {v['interval_s']:.1f}s", ""]
    rows = []
    for name, t in v["tiers"].items():
        rows.append(
            [
                name,
                size(t["capacity"]),
                size(t["used"]),
                pct(t["used"], t["capacity"]),
                f"{t['hits_per_s']:.1f}",
                f"{t['misses_per_s']:.1f}",
                "-" if t["hit_rate"] is None else f"{100 * t['hit_rate']:.1f}%",
                f"{t['in_bytes_per_s'] / 1e6:.1f}",
                f"{t['out_bytes_per_s'] / 1e6:.1f}",
            ]
        )
    lines.append(
        table(
            [
                "TIER",
                "CAPACITY",
                "USED",
                "USE%",
                "HITS/s",
                "MISSES/s",
                "HIT%",
                "IN MB/s",
                "OUT MB/s",
            ],
            rows,
            right="CAPACITY,USED,USE%,HITS/s,MISSES/s,HIT%,IN MB/s,OUT MB/s",
        )
    )
    lines.append("")
    lines.append(namespaces_table(v["namespaces"]))
    p = v["prefetch"]
    acc = "-" if p["accuracy_total"] is None else f"{100 * p['accuracy_total']:.1f}%"
    lines += [
        "",
        f"PREFETCH  issued {p['issued_per_s']:.1f}/s  used {p['used_per_s']:.1f}/s  "
        f"wasted {p['wasted_per_s']:.1f}/s  accuracy {acc}",
    ]
    lat = v.get("latency") or {}
    if lat:
        lines.append(
            "LATENCY   "
            + "  ".join(
                f"{op} p50 {x['p50_us']:.0f}us p99 {x['p99_us']:.0f}us"
                for op, x in sorted(lat.items())
                if op in ("read", "write", "open", "flush")
            )
        )
    return "\n".join(lines)


def cmd_top(args: argparse.Namespace) -> int:
    mount = find_mount(args.mount)
    prev = sample(mount)
    n = 0
    interactive = sys.stdout.isatty() and not args.json
    try:
        while args.count is None or n < args.count:
            time.sleep(args.interval)
            cur = sample(mount)
            view = render_top(mount, prev, cur)
            prev = cur
            n += 1
            if args.json:
                print(json.dumps(view), flush=True)
            elif interactive:
                sys.stdout.write("\x1b[H\x1b[2J" + top_text(view) + "\n")
                sys.stdout.flush()
            else:
                print(top_text(view) + "\n", flush=True)
    except KeyboardInterrupt:
        pass
    return 0


# --- parsers ---------------------------------------------------------------------------------
def add_parsers(sub) -> None:
    p = with_json(
        sub.add_parser("stat", help="where files' blocks are, how hot, what follows them")
    )
    p.add_argument("files", nargs="+")
    p.set_defaults(func=cmd_stat)

    p = with_json(sub.add_parser("ls", help="list a directory with the tier of each block"))
    p.add_argument("-l", "--long", action="store_true")
    p.add_argument("dir", nargs="?", default=".")
    p.set_defaults(func=cmd_ls)

    p = with_json(sub.add_parser("tree", help="learned prefix chains of a directory, as a tree"))
    p.add_argument("dir", nargs="?", default=".")
    p.set_defaults(func=cmd_tree)

    p = with_json(sub.add_parser("df", help="capacity, use and hit rates per tier"))
    p.add_argument("mount", nargs="?", default=".")
    p.set_defaults(func=cmd_df)

    p = with_json(sub.add_parser("du", help="bytes per tier under a path"))
    p.add_argument("path", nargs="?", default=".")
    p.set_defaults(func=cmd_du)

    p = with_json(
        sub.add_parser("top", help="a live view of tiers, namespaces, prefetch and latency")
    )
    p.add_argument("mount", nargs="?", default=".")
    p.add_argument("--interval", "-i", type=float, default=1.0, help="seconds between refreshes")
    p.add_argument("--count", "-n", type=int, help="stop after this many refreshes")
    p.set_defaults(func=cmd_top)
