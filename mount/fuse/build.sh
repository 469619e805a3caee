#!/usr/bin/env bash
# Build a FUSE-passthrough-capable stack into the project venv:
#   1. libfuse 3.17 from Debian trixie's *source* package (only a deb-src line is added, so nothing on
#      the system is upgraded), built with meson + ninja and installed into $VENV/opt/libfuse, never
#      into /usr: the system's libfuse 3.14 stays what every other program uses;
#   2. pyfuse3 3.5.0 from its sdist with pyfuse3-passthrough.patch (FileInfo.backing_id,
#      Operations.enable_passthrough, pyfuse3.passthrough_open/close/enabled), Cython-regenerated and
#      linked against that libfuse with an rpath, installed into $VENV as 3.5.0+kvfs.passthrough;
#      pyfuse3-fallocate.patch (FUSE_FALLOCATE dispatched to Operations.fallocate);
#      pyfuse3-requests.patch (a queued request is read without waiting for the fd; FileInfo.noflush);
#      pyfuse3-flush-ctx.patch (the request context of a flush); and pyfuse3-parallel-dirops.patch
#      (Operations.enable_parallel_dirops: FUSE_PARALLEL_DIROPS at INIT); and pyfuse3-killpriv.patch
#      (Operations.enable_killpriv_v2, Operations.user_xattrs_only: GETXATTR outside user.* answered
#      in the request loop).
# Run by `make install` as root. Idempotent: returns at once when that pyfuse3 is already installed
# from the same build.sh and patch. Build tools (meson, ninja, Cython) live in a throwaway venv under
# build/, not in the project venv.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root"

VENV=$(cd "${VENV:-.venv}" && pwd)
PY=$VENV/bin/python
PREFIX=$VENV/opt/libfuse
BUILD=$root/build/fuse
# applied in this order: passthrough (FileInfo.backing_id, ...), a fallocate handler, cheaper
# requests (and FileInfo.noflush), the flush handler's request context, parallel dirops, killpriv v2
PATCHES=("$here/pyfuse3-passthrough.patch" "$here/pyfuse3-fallocate.patch" "$here/pyfuse3-requests.patch"
         "$here/pyfuse3-flush-ctx.patch" "$here/pyfuse3-parallel-dirops.patch" "$here/pyfuse3-killpriv.patch")

LIBFUSE_SERIES=3.17            # Debian trixie's fuse3 (3.17.2-3 when this was written)
PYFUSE3_VERSION=3.5.0
LOCAL_VERSION=$PYFUSE3_VERSION+kvfs.passthrough
TOOLS_PINS=(meson==1.12.1 ninja==1.13.2 Cython==3.2.4 setuptools==80.9.0 setuptools_scm==8.3.1 wheel)
APT_LIST=/etc/apt/sources.list.d/kvfs-trixie-src.sources

log() { echo "[mount/fuse/build.sh] $*"; }
# Run a quiet build step with its output in $BUILD/$1.log, shown (the end of it) if the step fails.
step() {
  local name=$1; shift
  if ! "$@" >"$BUILD/$name.log" 2>&1; then
    echo "mount/fuse/build.sh: $name failed; the end of $BUILD/$name.log:" >&2
    tail -n 40 "$BUILD/$name.log" >&2
    exit 1
  fi
}
pip_q() { "$@" --disable-pip-version-check -q 2>&1 | { grep -v '^WARNING: Location' || true; }; }

build_id=$(cat "$here/build.sh" "${PATCHES[@]}" | sha256sum | cut -c1-16)

# The extension module of the installed pyfuse3, if it is ours and linked against $PREFIX.
installed_ok() {
  local so
  so=$("$PY" -c 'import pyfuse3; pyfuse3.passthrough_open; pyfuse3.Operations.fallocate; pyfuse3._takes_ctx; pyfuse3.parallel_dirops_enabled; pyfuse3.killpriv_v2_enabled
print(pyfuse3.__file__)' 2>/dev/null) || return 1
  [[ "$(ldd "$so")" == *"=> $PREFIX/lib/libfuse3.so"* ]] || return 1
  [ "$(cat "$PREFIX/kvfs-build-id" 2>/dev/null)" = "$build_id" ]
}

if installed_ok; then
  log "pyfuse3 $LOCAL_VERSION with passthrough is installed (libfuse in $PREFIX)"
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "mount/fuse/build.sh: building libfuse $LIBFUSE_SERIES needs root (apt source); run make install as root" >&2
  exit 1
fi
started=$SECONDS
mkdir -p "$BUILD"

# --- 1. libfuse source: trixie deb-src only --------------------------------------------------------
want_list='Types: deb-src
URIs: http://deb.debian.org/debian
Suites: trixie
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg'
if [ "$(cat "$APT_LIST" 2>/dev/null)" != "$want_list" ]; then
  log "adding $APT_LIST (trixie deb-src only: no binary package comes from trixie)"
  printf '%s\n' "$want_list" > "$APT_LIST"
  apt-get update -qq
elif ! ls /var/lib/apt/lists/*_dists_trixie_main_source_Sources* >/dev/null 2>&1; then
  apt-get update -qq
fi

fetch_source() {
  rm -rf "$BUILD/apt" && mkdir -p "$BUILD/apt"
  (cd "$BUILD/apt" && apt-get source -qq --download-only -o APT::Sandbox::User=root fuse3/trixie)
}
if ! fetch_source; then
  log "apt-get source failed; refreshing the package lists once"
  apt-get update -qq
  fetch_source
fi
dsc=$(ls "$BUILD"/apt/fuse3_*.dsc)
fuse_version=$(sed -n 's/^Version: //p' "$dsc")
case "$fuse_version" in
  "$LIBFUSE_SERIES".*) ;;
  *) echo "mount/fuse/build.sh: trixie's fuse3 is $fuse_version, not $LIBFUSE_SERIES.x: check the patch and this script" >&2
     exit 1 ;;
esac

# --- 2. build tools in a throwaway venv ------------------------------------------------------------
tools=$BUILD/tools
if ! "$tools/bin/python" -c 'import mesonbuild, ninja, Cython, setuptools_scm' 2>/dev/null; then
  log "installing build tools into $tools: ${TOOLS_PINS[*]}"
  rm -rf "$tools"
  "$PY" -m venv "$tools"   # the project venv's interpreter: the wheel is built for it
  pip_q "$tools/bin/python" -m pip install "${TOOLS_PINS[@]}"
fi
export PATH=$tools/bin:$PATH

# --- 3. libfuse into $PREFIX -----------------------------------------------------------------------
if [ "$(cat "$PREFIX/kvfs-libfuse-version" 2>/dev/null)" != "$fuse_version" ] \
   || [ ! -e "$PREFIX/lib/pkgconfig/fuse3.pc" ]; then
  log "building libfuse $fuse_version into $PREFIX"
  src=$BUILD/libfuse-src
  rm -rf "$src" "$BUILD/libfuse-build" "$PREFIX"
  step dpkg-source dpkg-source --no-copy -x "$dsc" "$src"  # applies Debian's patches
  # fusermount3 comes along: the 3.17 library mounts by itself as root and then spawns
  # "$PREFIX/bin/fusermount3 --auto-unmount" for -o auto_unmount (falling back to the one on PATH),
  # and Debian's 3.14 fusermount3 does not know that option. Everything stays inside the prefix: no
  # setuid bit (kvfs mounts as root), no init script, udev rules and fuse.conf under $PREFIX.
  step meson-setup meson setup "$BUILD/libfuse-build" "$src" --prefix="$PREFIX" --libdir=lib \
    --buildtype=release -Dexamples=false -Dtests=false -Duseroot=false -Dinitscriptdir= \
    -Dudevrulesdir="$PREFIX/lib/udev/rules.d"
  step ninja ninja -C "$BUILD/libfuse-build"
  step meson-install meson install -C "$BUILD/libfuse-build"
  echo "$fuse_version" > "$PREFIX/kvfs-libfuse-version"
fi

# --- 4. pyfuse3 with the patches -------------------------------------------------------------------
log "building pyfuse3 $LOCAL_VERSION against $PREFIX"
rm -rf "$BUILD/pyfuse3-$PYFUSE3_VERSION" "$BUILD/dist" "$BUILD/sdist"
pip_q "$tools/bin/python" -m pip download --no-binary :all: --no-deps -d "$BUILD/sdist" "pyfuse3==$PYFUSE3_VERSION"
tar -xzf "$BUILD/sdist/pyfuse3-$PYFUSE3_VERSION.tar.gz" -C "$BUILD"
(
  cd "$BUILD/pyfuse3-$PYFUSE3_VERSION"
  for p in "${PATCHES[@]}"; do
    patch -p1 --quiet < "$p"
  done
  rm -f src/pyfuse3/__init__.c   # generated from the unpatched .pyx: Cython regenerates it
  export PKG_CONFIG_PATH=$PREFIX/lib/pkgconfig
  export LDFLAGS="-Wl,-rpath,$PREFIX/lib"
  export SETUPTOOLS_SCM_PRETEND_VERSION=$LOCAL_VERSION
  step pyfuse3-wheel "$tools/bin/python" -m pip wheel --disable-pip-version-check --no-build-isolation \
    --no-deps -w "$BUILD/dist" .
)
whl=$(ls "$BUILD"/dist/pyfuse3-"$LOCAL_VERSION"-*.whl)
pip_q "$PY" -m pip install --force-reinstall --no-deps "$whl"
pip_q "$PY" -m pip install "$whl"   # its dependency (trio), if missing
echo "$build_id" > "$PREFIX/kvfs-build-id"

if ! installed_ok; then
  so=$("$PY" -c 'import pyfuse3; print(pyfuse3.__file__)' || true)
  echo "mount/fuse/build.sh: the installed pyfuse3 ($so) is not the passthrough build linked against $PREFIX:" >&2
  [ -n "$so" ] && ldd "$so" | grep fuse >&2
  exit 1
fi
log "done in $((SECONDS - started)) s: pyfuse3 $LOCAL_VERSION, libfuse $fuse_version in $PREFIX"
