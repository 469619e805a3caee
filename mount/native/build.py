"""Compile kvfs's per-file path (kvfs/native.py's MODULES) with Cython into kvfs/_native/.

Run by `make install` (mount/native/build.sh) with the build tools' interpreter (the project
venv's Python with Cython, in build/fuse/tools): each module's `.py`, with its `.pxd` where there
is one, is translated to C by Cython (pure-Python mode) and compiled by the system's gcc against
the project venv's Python headers; then kvfs/_native/manifest.json records each module's
extension file and the digest of its sources, which kvfs/native.py's finder checks at import.

A module whose sources did not change since the last build is not compiled again. The output of
Cython and gcc is kept in build/native/<module>.log and shown only when a step fails: a clean
build prints one line.

    build/fuse/tools/bin/python mount/native/build.py [--jobs 2] [--force]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from kvfs import native  # noqa: E402  (stdlib only; the finder is not used here)

BUILD = ROOT / "build" / "native"

# Cython's directives for every module. The source stays Python: annotations do not type
# anything (annotation_typing off: `x: float` would become a C double that rejects None, `dict`
# an exact dict); types come only from the .pxd beside a module. binding stays on (methods of
# plain classes must bind), and division and overflow keep Python's semantics.
DIRECTIVES = {
    "language_level": "3",
    "annotation_typing": "False",
    "binding": "True",
    "always_allow_keywords": "True",
    "profile": "False",
    "embedsignature": "False",
}


def compile_one(module: str, python_include: str, ext_suffix: str) -> tuple[str, str, str]:
    """Cython then gcc for one module; returns (module, extension file name, digest)."""
    src = native.sources(module)[0]
    c_file = BUILD / f"{module}.c"
    so_name = f"{module}{ext_suffix}"
    so_tmp = BUILD / so_name
    log_path = BUILD / f"{module}.log"
    digest = native.digest(module)
    directives = [a for k, v in DIRECTIVES.items() for a in ("-X", f"{k}={v}")]
    # -I the repository root: Cython finds the .pxd beside the .py by the module's full name
    steps = [
        [sys.executable, "-m", "cython", *directives, "--module-name", module, "-I", str(ROOT)]
        + ["-o", str(c_file), str(src)],
        ["gcc", "-shared", "-fPIC", "-O2", "-g0", "-fno-strict-aliasing", "-DNDEBUG"]
        + ["-Wno-unused-function", "-Wno-unused-result", f"-I{python_include}"]
        + ["-o", str(so_tmp), str(c_file)],
    ]
    with open(log_path, "w") as log:
        for cmd in steps:
            log.write("$ " + " ".join(cmd) + "\n")
            log.flush()
            r = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
            if r.returncode != 0:
                log.close()
                tail = log_path.read_text()[-4000:]
                raise RuntimeError(f"compiling {module} failed ({log_path}):\n{tail}")
    os.replace(so_tmp, native.NATIVE_DIR / so_name)
    return module, so_name, digest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--force", action="store_true", help="compile every module again")
    ap.add_argument("--python-include", help="the project Python's headers (default: this one's)")
    args = ap.parse_args(argv)
    include = args.python_include or sysconfig.get_paths()["include"]
    ext_suffix = sysconfig.get_config_var("EXT_SUFFIX")
    BUILD.mkdir(parents=True, exist_ok=True)
    native.NATIVE_DIR.mkdir(exist_ok=True)
    try:
        old = json.loads(native.MANIFEST.read_text()).get("modules", {})
    except (OSError, ValueError):
        old = {}
    modules: dict = {}
    todo = []
    for m in native.MODULES:
        e = old.get(m)
        current = (
            e is not None
            and not args.force
            and e.get("digest") == native.digest(m)
            and (native.NATIVE_DIR / e["file"]).exists()
        )
        if current:
            modules[m] = e
        else:
            todo.append(m)
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        for m, so_name, digest in pool.map(lambda m: compile_one(m, include, ext_suffix), todo):
            modules[m] = {"file": so_name, "digest": digest}
    # extension files of modules no longer listed go
    keep = {e["file"] for e in modules.values()}
    for f in native.NATIVE_DIR.glob("*.so"):
        if f.name not in keep:
            f.unlink()
    from Cython import __version__ as cython_version

    manifest = {"cython": cython_version, "modules": modules}
    tmp = native.MANIFEST.with_suffix(".tmp")
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, native.MANIFEST)
    print(
        f"[mount/native/build.py] {len(native.MODULES)} modules compiled with Cython "
        f"{cython_version} into kvfs/_native ({len(todo)} built now)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
