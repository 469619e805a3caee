# kvfs: set-up, demo and tests. Run as root on Debian 12 (or similar).
#   make run    installs everything, mounts kvfs at ./mnt (MNT=...) and shows it working
#   make test   installs everything and runs the whole test suite
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c

VENV        ?= .venv
PY          := $(VENV)/bin/python
PIP         := $(PY) -m pip --disable-pip-version-check -q
MNT         ?= ./mnt
PYTHON      ?= python3
APT_PACKAGES := libfuse3-dev fuse3 attr fio redis-server redis-sentinel tmux pkg-config python3-venv python3-dev \
                util-linux e2fsprogs dmsetup gcc openssl rdma-core libibverbs-dev ibverbs-utils python3-pyverbs \
                dpkg-dev
TORCH_PIN   := torch==2.13.0
KVIKIO_PKGS := kvikio-cu12 libkvikio-cu12 nvidia-cufile-cu12 rapids-logger cuda-pathfinder
STAMP       := $(VENV)/.installed

.PHONY: install system-packages fuse-passthrough install-system run test test-fast lint bench clean-mount help

help:
	@echo "make run     install, mount kvfs at $(MNT) with the embedded default, show it working"
	@echo "make test    install, run the whole test suite"
	@echo "make install only install (apt packages, $(VENV), kvfs and its dependencies)"

install: system-packages $(STAMP) fuse-passthrough install-system

# libfuse 3.17 (in $(VENV)/opt/libfuse) and pyfuse3 patched for FUSE passthrough, see
# docs/passthrough.md. Also run on every install (a second or less when nothing changed), so that a
# pyfuse3 replaced by hand is rebuilt.
FUSE_BUILD := mount/fuse/build.sh $(wildcard mount/fuse/*.patch)
fuse-passthrough: $(STAMP)
	@VENV=$(VENV) bash mount/fuse/build.sh

# The kvfs command on PATH and the mount(8) helper (mount -t fuse.kvfs, fstab); as root only.
install-system: $(STAMP)
	@if [ "$$(id -u)" = 0 ]; then \
	  ln -sfn "$(abspath $(VENV))/bin/kvfs" /usr/local/bin/kvfs; \
	  sed 's|@KVFS@|/usr/local/bin/kvfs|' mount/mount.kvfs > /usr/sbin/mount.kvfs.new; \
	  chmod 755 /usr/sbin/mount.kvfs.new && mv /usr/sbin/mount.kvfs.new /usr/sbin/mount.kvfs; \
	  ln -sfn mount.kvfs /usr/sbin/mount.fuse.kvfs; \
	  install -D -m 644 mount/kvfs.service /etc/systemd/system/kvfs.service; \
	fi

# apt-get runs only when a package is missing, so repeated installs are quick and offline.
system-packages:
	@missing=$$(for p in $(APT_PACKAGES); do \
	    dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; \
	  done); \
	if [ -n "$$missing" ]; then \
	  echo "installing apt packages:" $$missing; \
	  if [ "$$(id -u)" != 0 ]; then echo "make install: run as root to install apt packages" >&2; exit 1; fi; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

$(STAMP): pyproject.toml Makefile $(FUSE_BUILD)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@VENV=$(VENV) bash mount/fuse/build.sh
	@echo "installing kvfs and its dependencies into $(VENV)"
	@$(PIP) install -e '.[test]' 2>&1 | grep -v '^WARNING: Location' || true
	@$(PY) -c 'import pyfuse3, trio, xattr, xxhash, zmq, msgspec, pytest'
	@# pyverbs comes from Debian (PyPI's does not build): let the venv see that one package only
	@site=$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'); \
	  mkdir -p $(VENV)/debian-site && ln -sfn /usr/lib/python3/dist-packages/pyverbs $(VENV)/debian-site/pyverbs; \
	  echo "$(abspath $(VENV))/debian-site" > $$site/kvfs-debian-pyverbs.pth
	@$(PY) -c 'import pyverbs.device'
	@echo "installing kvikio (host and GPU direct reads; its CUDA libraries come with the driver)"
	@$(PIP) install --no-deps $(KVIKIO_PKGS) 2>&1 | grep -v '^WARNING: Location' || true
	@$(PY) -c 'import kvikio' 
	@echo "installing $(TORCH_PIN) (CPU) and LMCache for the integration tests"
	@$(PY) -c 'import torch' 2>/dev/null || $(PIP) install $(TORCH_PIN) 2>&1 | grep -v '^WARNING: Location' || true
	@# (pip says kvikio wants CuPy: kvikio's host path needs none, and CuPy is GPU-only; the
	@# dependency check's two lines about it are dropped, anything else it says is shown)
	@$(PIP) install -e '.[test,lmcache]' 2>&1 | grep -v -e '^WARNING: Location' \
	  -e "^ERROR: pip's dependency resolver does not currently take into account" \
	  -e '^kvikio-cu12 .* requires cupy-cuda12x' || true
	@$(MAKE) --no-print-directory install-clients
	@$(MAKE) --no-print-directory install-engine
	@$(PY) -c 'import lmcache, torch'
	@$(PY) -c 'import pyfuse3; pyfuse3.passthrough_open' || \
	  { echo "pip replaced the passthrough pyfuse3 (see mount/fuse/build.sh)" >&2; exit 1; }
	@touch $@

run: install
	@mkdir -p $(MNT)
	@if mountpoint -q $(MNT); then echo "$(MNT) is already mounted"; else $(VENV)/bin/kvfs mount $(MNT); fi
	@$(PY) mount/demo.py $(MNT)

# The whole suite with FUSE passthrough (the default where the kernel has it) and the default
# durability ("fsync": close is not a commit), then the mounted and LMCache tests again on the
# daemon-served data path (what older kernels get) with durability "close" (the crash tests
# run both modes in each pass), and the unit tests too, with the small blocks' I/O on worker
# threads and no I/O worker processes (KVFS_TEST_IO=threads).
test: install lint
	$(PY) -m pytest -q tests
	KVFS_PASSTHROUGH=off KVFS_TEST_DURABILITY=close KVFS_TEST_IO=threads \
	  $(PY) -m pytest -q tests/unit tests/mounted tests/lmcache

# ruff's lint rules and its formatting, over the whole tree (configuration: pyproject.toml;
# `.venv/bin/ruff format kvfs testing bench tests` formats)
lint: install
	$(VENV)/bin/ruff check --quiet .
	$(VENV)/bin/ruff format --check --quiet .

test-fast: install lint
	$(PY) -m pytest -q -m "not slow and not lmcache and not clients and not engine" tests

bench: install
	$(PY) bench/fuse_read.py

clean-mount:
	-$(VENV)/bin/kvfs umount $(MNT)

# vLLM's fs tier, SGLang's HiCacheFile and LMCache's NIXL POSIX backend for tests/clients: the pins
# of pyproject.toml's extras vllm, sglang and nixl, with --no-deps (torch and LMCache stay as they
# are). Run from the $(STAMP) recipe after LMCache; quick when everything is installed.
.PHONY: install-clients
CLIENT_EXTRAS := vllm sglang nixl
install-clients:
	@echo "installing the engines' file tiers (extras: $(CLIENT_EXTRAS)) for tests/clients"
	@$(PIP) install --no-deps $$($(PY) -c 'import tomllib; x = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]; print(*(p for e in "$(CLIENT_EXTRAS)".split() for p in x[e]))') 2>&1 | grep -v '^WARNING: Location' || true
	@$(PY) -c 'import nixl._api, torch, lmcache, vllm.v1.kv_offload.tiering.fs.manager, sglang.srt.mem_cache.hicache_storage' || \
	  { echo "make install-clients: an engine's file tier does not import" >&2; exit 1; }

# A real engine for bench/ttft.py and tests/engine/: vLLM (CPU) runs a model and LMCache's
# multiprocess server keeps its KV cache in a directory. .venv-engine is a layer over $(VENV)
# (a .pth file makes $(VENV)'s packages visible under its own), holding only what running a
# model needs beyond the file-tier pins: pyproject.toml's extra "engine", with --no-deps.
.PHONY: install-engine
ENGINE_VENV := .venv-engine
install-engine:
	@echo "installing what vLLM needs to run a model (extra: engine) into $(ENGINE_VENV)"
	@test -x $(ENGINE_VENV)/bin/python || $(PY) -m venv $(ENGINE_VENV)
	@base=$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'); \
	  layer=$$($(ENGINE_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'); \
	  echo "$$base" > $$layer/zz-kvfs-base-venv.pth
	@$(ENGINE_VENV)/bin/python -m pip --disable-pip-version-check -q install --no-deps $$($(PY) -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["engine"])') 2>&1 | grep -v '^WARNING: Location' || true
	@$(ENGINE_VENV)/bin/python -c 'import vllm.entrypoints.llm, lmcache.v1.multiprocess.server, kvfs' >/dev/null 2>&1 || \
	  { echo "make install-engine: vLLM or LMCache's server does not import in $(ENGINE_VENV)" >&2; exit 1; }
