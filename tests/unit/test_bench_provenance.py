"""Every bench's --json says which commit measured it (bench.dumps), so that a figure cited from
bench/results/ can be traced to the code it describes."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from bench import ROOT, dumps


def test_a_result_carries_its_commit_command_and_time():
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    out = json.loads(dumps({"x": 1, "argv": ["mine"]}))
    assert out["commit"] == head and isinstance(out["dirty"], bool)
    assert out["x"] == 1 and out["argv"] == ["mine"]  # the result's own keys win
    for key in ("measured_at", "finished_at"):
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", out[key])


def test_every_bench_writes_its_json_through_dumps():
    for f in sorted(Path(ROOT, "bench").glob("*.py")):
        text = f.read_text()
        assert "print(json.dumps(" not in text, f"{f.name} writes JSON without its provenance"
