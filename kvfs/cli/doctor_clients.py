"""kvfs doctor: which inference engines keep KV cache in this mount, and whether their eviction
and kvfs's agree.

An engine that decides on its own what is in its cache (an index in its memory) and a pool that
deletes the least recently used files when it is full can disagree: the engine then lists chunks
kvfs has deleted. Where the engine looks chunks up by name (stat) a deleted chunk is a clean
miss; where it trusts its index it is an error at read. The directories are recognized by their
file names (a sample of each directory, three levels deep), so this never reads a chunk.

    LMCache local_disk     flat <model>@<ws>@<worker>@<hash>@<dtype>.pt, index in memory
    LMCache NIXL, static   obj_<i>_<hex4>.bin slot files held open by the engine
    LMCache NIXL, dynamic  flat <model>_<ws>_<worker>_<hash>_<dtype>, looked up by stat
    SGLang HiCacheFile     flat <sha256>_<model>_<tp rank>_<tp size>.bin, looked up by stat
    vLLM fs tier           <model>_<hash>/config.json, blocks under <model>_<hash>_r<rank>/
"""

from __future__ import annotations

import json
import math
import os
import re

from kvfs.cli.findings import Finding
from kvfs.units import format_size

SAMPLE = 64  # file names looked at per directory
MAX_DIRS = 256  # directories looked at per mount

LMCACHE_DISK = re.compile(r"^.+@\d+@\d+@-?[0-9a-f]+@[A-Za-z0-9_]+\.pt$")
NIXL_SLOT = re.compile(r"^obj_\d+_[0-9a-f]{4}\.bin$")
NIXL_DYNAMIC = re.compile(
    r"^.+_\d+_\d+_-?[0-9a-f]+_(bfloat16|float16|float32|float8_e4m3fn|"
    r"float8_e5m2|uint8|int8)$"
)
SGLANG_FILE = re.compile(r"^[0-9a-f]{64}(\.[a-z_0-9]+)?_.+_\d+_\d+(_.+)?\.bin$")


def _sample(path: str) -> tuple[list[str], list[str], int]:
    """(up to SAMPLE file names, subdirectory names, entries seen) of a directory."""
    files, dirs, n = [], [], 0
    try:
        with os.scandir(path) as it:
            for e in it:
                n += 1
                if e.is_dir(follow_symlinks=False):
                    if len(dirs) < MAX_DIRS:
                        dirs.append(e.name)
                elif len(files) < SAMPLE:
                    files.append(e.name)
                if len(files) >= SAMPLE and len(dirs) >= MAX_DIRS:
                    break
    except OSError:
        pass
    return files, dirs, n


def _is_vllm(path: str) -> bool:
    try:
        with open(os.path.join(path, "config.json")) as f:
            return json.load(f).get("inference_engine") == "vllm"
    except (OSError, ValueError, AttributeError):
        return False


def _kind(path: str, files: list[str]) -> str | None:
    if "config.json" in files and _is_vllm(path):
        return "vllm"
    names = [f for f in files if not f.startswith(".")]
    if not names:
        return None
    for kind, pat in (
        ("lmcache_disk", LMCACHE_DISK),
        ("nixl_static", NIXL_SLOT),
        ("nixl_dynamic", NIXL_DYNAMIC),
        ("sglang", SGLANG_FILE),
    ):
        if sum(bool(pat.match(n)) for n in names) * 2 > len(names):
            if kind == "lmcache_disk" and _has_xattr(
                os.path.join(path, names[0]), "user.lmcache.meta"
            ):
                return "lmcache_plugin"  # kvfs's own LMCache plugin: same names
            return kind
    return None


def _has_xattr(path: str, name: str) -> bool:
    try:
        os.getxattr(path, name)
        return True
    except OSError:
        return False


def find_client_dirs(mount: str, depth: int = 3) -> list[tuple[str, str]]:
    """(directory, kind) for every directory (up to `depth` below the mount) that an engine
    recognizably uses."""
    out: list[tuple[str, str]] = []
    todo, seen = [(mount, 0)], 0
    while todo and seen < MAX_DIRS:
        path, level = todo.pop(0)
        seen += 1
        files, dirs, _ = _sample(path)
        kind = _kind(path, files)
        if kind is not None:
            out.append((path, kind))
            if kind == "vllm":
                continue  # its fan-out directories hold its blocks
        if level < depth:
            todo += [(os.path.join(path, d), level + 1) for d in sorted(dirs)]
    return out


def _lmcache_disk_finding(where: str, cap: int, safe: int, evict: str, evicted: int) -> Finding:
    """LMCache local_disk trusts its in-memory index, so kvfs's eviction surfaces as errors."""
    detail = (
        where + "LMCache local_disk keeps its index in the engine's memory: if "
        "max_local_disk_size is more than the pool holds, kvfs's eviction deletes chunks "
        "LMCache still lists (contains() says yes, get_blocking raises KeyError)"
    )
    if evict == "never":
        detail = (
            where + "LMCache local_disk counts its own bytes and does not check "
            "its writes: past the pool's capacity they fail with ENOSPC unnoticed"
        )
    if evicted:
        detail += f"; kvfs has evicted {evicted} file(s) since it started"
    return Finding(
        "warn" if evicted or evict == "never" else "info",
        "clients",
        detail,
        "set max_local_disk_size to at most "
        f"{math.floor(safe / 1e6) / 1e3:g} (GB, 90% of "
        f"the pool's {format_size(cap)}), or use LMCache's fs connector or "
        "kvfs's LMCache plugin, which look chunks up by name",
    )


def _nixl_static_finding(where: str) -> Finding:
    """LMCache's NIXL slot files stay open and outlive the engine's index: say so."""
    return Finding(
        "warn",
        "clients",
        where + "LMCache NIXL static pool (nixl_pool_size > 0): the engine keeps its slot "
        "files open, so their chunks stay uncommitted in kvfs's memory until it "
        "exits; its index is in memory and a restarted engine writes new slot "
        "files, leaving the old ones for kvfs's eviction",
        "use nixl_pool_size: 0 (one file per chunk, looked up by name, survives "
        "restarts, evicted by kvfs as a clean miss)",
    )


def _by_name_finding(where: str, kind: str, evict: str) -> Finding:
    """NIXL dynamic and vLLM's fs tier rely on kvfs's eviction alone: it must be on."""
    name = {"nixl_dynamic": "LMCache NIXL dynamic backend", "vllm": "vLLM's fs tier"}[kind]
    if evict == "never":
        return Finding(
            "warn",
            "clients",
            where + f"{name} never deletes a chunk "
            f'and evict = "never": the pool fills and its stores fail',
            'set [pool] evict = "prefix" (or "lru"): kvfs\'s eviction is its eviction',
        )
    return Finding(
        "ok",
        "clients",
        where + f"{name}: no eviction of its own, "
        f"looks chunks up by name: kvfs evicts them as clean "
        f"misses",
    )


def _sglang_finding(where: str, cap: int, evict: str) -> Finding:
    """SGLang HiCacheFile evicts by free space: suggest a min_free_space ahead of kvfs's."""
    return Finding(
        "ok" if evict != "never" else "info",
        "clients",
        where + "SGLang HiCacheFile looks pages up by name: pages kvfs evicts are clean misses",
        f"set min_free_space (e.g. {format_size(cap // 10)}) so that SGLang evicts by "
        f"statvfs before kvfs has to"
        + ("" if evict != "never" else ' (with evict = "never" it must)'),
    )


def _lmcache_plugin_finding(where: str) -> Finding:
    """kvfs's own LMCache plugin agrees with kvfs's eviction by design: report it ok."""
    return Finding(
        "ok",
        "clients",
        where + "kvfs's LMCache plugin: no index of its own, evicted chunks are clean misses",
    )


def check_clients(mount: str, st: dict) -> list[Finding]:
    """Findings for the engines' directories in one mount (st: the mount's statistics)."""
    pool = st["tiers"]["pool"]
    cap, evict = pool["capacity"], pool["evict"]
    evicted = pool.get("evictions", 0)
    safe = int(cap * 0.9)
    out = []
    for path, kind in find_client_dirs(mount):
        where = f"{path}: "
        if kind == "lmcache_disk":
            out.append(_lmcache_disk_finding(where, cap, safe, evict, evicted))
        elif kind == "nixl_static":
            out.append(_nixl_static_finding(where))
        elif kind in ("nixl_dynamic", "vllm"):
            out.append(_by_name_finding(where, kind, evict))
        elif kind == "sglang":
            out.append(_sglang_finding(where, cap, evict))
        elif kind == "lmcache_plugin":
            out.append(_lmcache_plugin_finding(where))
    return out
