"""kvfs's Lua scripts for Redis, kept as .lua files next to this module.

Every script runs atomically in Redis with KEYS[1] = the pool's key prefix; `lib.lua` (helpers:
the clock, error replies, lease checks, the grave, the change-log entry) is prepended to each.
docs/cluster.md lists the keys and fields they use. tests/unit/test_lua_scripts.py loads each
one into a real redis-server.
"""

from __future__ import annotations

from pathlib import Path

LUA_DIR = Path(__file__).resolve().parent / "lua"
LOG_MAXLEN = 100_000  # entries kept in the change log (a node further behind resyncs)

NAMES = (
    "mknode",
    "publish",
    "remove",
    "rename",
    "update",
    "links",
    "atimes",
    "purge",
    "hold",
    "acquire",
    "renew",
    "release",
    "init",
    "unlock_init",
    "ghost",
    "floor",
    "dirmark",
    "leasecopy",
)


class Scripts:
    """The scripts' texts, read once: `SCRIPTS.publish` and so on."""

    def __init__(self, directory: Path = LUA_DIR):
        lib = (directory / "lib.lua").read_text().replace("@LOG_MAXLEN@", str(LOG_MAXLEN))
        self.lib = lib
        for name in NAMES:
            setattr(self, name, lib + (directory / f"{name}.lua").read_text())

    def all(self) -> dict[str, str]:
        return {name: getattr(self, name) for name in NAMES}


SCRIPTS = Scripts()
