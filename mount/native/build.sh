#!/usr/bin/env bash
# Compile kvfs's per-file path (kvfs/native.py's MODULES) with Cython into kvfs/_native/: run by
# `make install` after mount/fuse/build.sh, whose build-tools venv (build/fuse/tools: the project
# venv's Python with Cython) it uses; where that one has no Cython it makes its own
# (build/native/tools). Quick when nothing changed (mount/native/build.py compiles only modules
# whose sources changed).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root"
VENV=$(cd "${VENV:-.venv}" && pwd)
tools=$root/build/fuse/tools
CYTHON_PIN=Cython==3.2.4   # the pin of mount/fuse/build.sh's TOOLS_PINS
"$tools/bin/python" -c 'import Cython' 2>/dev/null || tools=$root/build/native/tools
if ! "$tools/bin/python" -c 'import Cython' 2>/dev/null; then
  echo "[mount/native/build.sh] installing $CYTHON_PIN into $tools"
  rm -rf "$tools"
  "$VENV/bin/python" -m venv "$tools"
  "$tools/bin/python" -m pip install --disable-pip-version-check -q "$CYTHON_PIN" 2>&1 \
    | { grep -v '^WARNING: Location' || true; }
fi
# the extension modules are built for the project venv's interpreter (the tools venv's is the
# same binary); its headers come from python3-dev (Makefile's APT_PACKAGES)
include=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
exec "$tools/bin/python" "$here/build.py" --python-include "$include" "$@"
