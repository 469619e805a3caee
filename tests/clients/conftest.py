"""Engines (testing/engine.py) started once per test module, two per client: two inference
servers sharing a node's kvfs mount, or one per node in cluster tests."""

from __future__ import annotations

import importlib.util

import pytest

from testing.engine import Engine
from tests.helpers import can_mount

CLIENT_MODULES = {"vllm": "vllm", "sglang": "sglang", "nixl": "nixl_cu12"}


def engine_pair(client: str, tmp_path_factory):
    """Start two engines of `client` in parallel (each imports its library: seconds)."""
    why = can_mount()
    if why:
        pytest.skip(why)
    if importlib.util.find_spec(CLIENT_MODULES[client]) is None:
        pytest.skip(f"{client} is not installed: run `make install` (target install-clients)")
    d = tmp_path_factory.mktemp(f"{client}-engines")
    engines = [Engine(client, d / f"engine{i}.log") for i in range(2)]
    try:
        for e in engines:
            e.ready()
    except Exception:
        for e in engines:
            e.close()
        raise
    return engines
