"""The Prometheus text kvfs serves on metrics_port, rendered from a statistics dict."""

from __future__ import annotations

from kvfs.metrics import render


def _stats(**extra) -> dict:
    tier = {
        "capacity": 100,
        "used": 40,
        "hits": 3,
        "misses": 1,
        "bytes_in": 7,
        "bytes_out": 5,
        "evictions": None,  # (a value of None is left out)
    }
    ns = {"index": 0, "state": "ok", "bytes_read": 1, "bytes_written": 2, "errors": 0}
    files = ("commits", "commit_errors", "pool_evictions", "creates", "opens")
    return {
        "uptime_s": 12.5,
        "tiers": {"dram": tier, "pool": tier},
        "namespaces": [
            {**ns, "path": '/dev/a"b\\c', "inflight": 4},
            {**ns, "index": 1, "path": "/dev/d", "state": "failed", "inflight": 0},
        ],
        "prefetch": dict.fromkeys(
            ("issued", "used", "joined", "wasted", "cancelled", "skipped"), 0
        ),
        "latency": {"read": {"count": 9, "p50_us": 100, "p90_us": 2000, "p99_us": 30000}},
        "files": {
            **dict.fromkeys(files, 1),
            "passthrough_opens": 1,
            "plain_opens": 0,
            "open_handles": 2,
        },
        **extra,
    }


def test_every_family_is_announced_once_and_in_order():
    text = render(_stats())
    assert text.endswith("\n")
    lines = text.splitlines()
    assert lines[:3] == [
        "# HELP kvfs_up 1 while the daemon serves",
        "# TYPE kvfs_up gauge",
        "kvfs_up 1.0",
    ]
    families = [line.split()[2] for line in lines if line.startswith("# TYPE")]
    assert len(families) == len(set(families))
    order = [
        "kvfs_uptime_seconds",
        "kvfs_tier_capacity_bytes",
        "kvfs_namespace_up",
        "kvfs_prefetch_issued_total",
        "kvfs_requests_total",
        "kvfs_commits_total",
        "kvfs_open_handles",
    ]
    assert [families.index(f) for f in order] == sorted(families.index(f) for f in order)
    assert 'kvfs_tier_used_bytes{tier="pool"} 40.0' in lines
    assert not any(f.startswith("kvfs_tier_evictions") for f in families)  # None: no sample
    assert not any(f.startswith("kvfs_events_") for f in families)  # [events] off


def test_labels_are_escaped_and_samples_are_floats():
    lines = render(_stats()).splitlines()
    assert 'kvfs_namespace_inflight{namespace="0",path="/dev/a\\"b\\\\c"} 4.0' in lines
    assert 'kvfs_namespace_up{namespace="1",path="/dev/d"} 0.0' in lines
    assert 'kvfs_request_latency_seconds{op="read",quantile="99"} 0.03' in lines
    assert "kvfs_uptime_seconds 12.5" in lines


def test_kv_event_counters_appear_with_events_on():
    keys = ("batches", "stored", "removed", "dropped_batches", "replayed_batches")
    lines = render(_stats(events=dict.fromkeys(keys, 3))).splitlines()
    assert "# HELP kvfs_events_stored_total BlockStored events sent" in lines
    assert [line for line in lines if line.startswith("kvfs_events_")] == [
        f"kvfs_events_{k}_total 3.0" for k in keys
    ]
