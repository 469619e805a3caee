"""The compiled per-file path (issue 45): which of kvfs's modules `make install` compiles with
Cython, and how an import chooses between a module's compiled build and its Python source.

The compiled build is the default. Each module in `MODULES` is its own Python source (`.py`),
compiled as it is by Cython's pure-Python mode, typed where a `.pxd` of the same name sits
beside it (an "augmenting" declaration file: cdef classes, typed attributes and locals); the
`.py` stays the twin that runs everywhere, one source for both. mount/native/build.py builds the
extension modules into kvfs/_native/ (ignored by git) and writes kvfs/_native/manifest.json with
the digest of each module's sources (the `.py` and its `.pxd`).

An import of a module in `MODULES` (the finder, installed by kvfs/__init__.py) loads its compiled
build only when the manifest's digest is that of the sources now: a module edited since the last
build runs from its source, with one warning naming it, never as old compiled code. With
KVFS_PURE_PYTHON=1 in the environment every module runs from its source (`make test`'s second
pass runs so). `status()` says which ran how: the daemon's statistics carry it (`native`), and
a test fails when a module that should be compiled is not (tests/unit/test_native.py).

This module imports only the standard library: the build script imports it with the build
tools' interpreter, before kvfs's dependencies exist.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import sys
import warnings
from pathlib import Path

# The modules compiled, in the order a store and a load go through them (docs/architecture.md,
# "The per-file budget"; docs/performance.md has what each measured).
MODULES: tuple[str, ...] = (
    "kvfs.tiers.index",
    "kvfs.tiers.scoring",
    "kvfs.tiers.policy",
    "kvfs.pool.layout",
    "kvfs.fs.latency",
)

PACKAGE_DIR = Path(__file__).resolve().parent
NATIVE_DIR = PACKAGE_DIR / "_native"
MANIFEST = NATIVE_DIR / "manifest.json"
PURE_ENV = "KVFS_PURE_PYTHON"


def pure_requested() -> bool:
    """True when KVFS_PURE_PYTHON asks for every module from its Python source."""
    return os.environ.get(PURE_ENV, "").strip() not in ("", "0")


def sources(module: str) -> list[Path]:
    """The files a module's compiled build is made from: its .py and, if there is one, its .pxd."""
    base = PACKAGE_DIR.parent.joinpath(*module.split("."))
    py, pxd = base.with_suffix(".py"), base.with_suffix(".pxd")
    return [py, pxd] if pxd.exists() else [py]


def digest(module: str) -> str:
    """sha256 over a module's sources (names and bytes), as the manifest records it."""
    h = hashlib.sha256()
    for path in sources(module):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


class NativeFinder:
    """A meta-path finder for `MODULES`: the compiled build when it is current, else nothing
    (the ordinary finders then load the source)."""

    def __init__(self, manifest: Path = MANIFEST) -> None:
        self.manifest_path = manifest
        self._manifest: dict | None = None
        self.loaded: dict[str, str] = {}  # module -> "compiled" | "source" | "stale" | "missing"

    def manifest(self) -> dict:
        if self._manifest is None:
            try:
                self._manifest = json.loads(self.manifest_path.read_text()).get("modules", {})
            except (OSError, ValueError):
                self._manifest = {}
        return self._manifest

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MODULES:
            return None
        if pure_requested():
            self.loaded[fullname] = "source"
            return None
        entry = self.manifest().get(fullname)
        so = self.manifest_path.parent / entry["file"] if entry else None
        if entry is None or not so.exists():
            self.loaded[fullname] = "missing"
            return None
        if entry.get("digest") != digest(fullname):
            self.loaded[fullname] = "stale"
            warnings.warn(
                f"kvfs: {fullname} changed since it was compiled: running its source "
                f"(make install compiles it again)",
                RuntimeWarning,
                stacklevel=2,
            )
            return None
        self.loaded[fullname] = "compiled"
        loader = importlib.machinery.ExtensionFileLoader(fullname, str(so))
        return importlib.util.spec_from_file_location(fullname, so, loader=loader)


FINDER = NativeFinder()


def install() -> None:
    """Put the finder first on sys.meta_path (once)."""
    if not any(isinstance(f, NativeFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, FINDER)


def is_compiled(module) -> bool:
    """Whether an imported module is an extension module (its compiled build)."""
    return isinstance(getattr(module, "__loader__", None), importlib.machinery.ExtensionFileLoader)


def status() -> dict:
    """How each module of `MODULES` runs in this process: `mode` ("compiled" when every
    imported one is compiled, "pure" under KVFS_PURE_PYTHON=1, else "mixed"), and the modules
    by how they were loaded (`compiled`, `source`; `stale` and `missing` are loaded from source
    too, and say why)."""
    out: dict = {"compiled": [], "source": [], "stale": [], "missing": []}
    for name in MODULES:
        mod = sys.modules.get(name)
        if mod is None:
            continue
        how = "compiled" if is_compiled(mod) else FINDER.loaded.get(name, "source")
        out[how].append(name)
    if pure_requested():
        out["mode"] = "pure"
    elif out["source"] or out["stale"] or out["missing"]:
        out["mode"] = "mixed"
    else:
        out["mode"] = "compiled"
    return out
