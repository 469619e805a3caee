"""Prometheus metrics: the daemon's statistics served as text on `metrics_port`.

The same numbers as `user.kvfs.stats`, flattened into the Prometheus exposition format
(counters end in _total, sizes in _bytes). A tiny HTTP/1.0 server on trio: GET /metrics.
"""

from __future__ import annotations

import logging
from typing import Callable

import trio

log = logging.getLogger("kvfs.metrics")


def _esc(v) -> str:
    return str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


# metric(name, kind, help, value, **labels): one sample, its HELP and TYPE before the first
_Metric = Callable[..., None]


def _tier_metrics(metric: _Metric, tiers: dict) -> None:
    """Capacity, use and traffic of each tier (DRAM, local, pool), labelled by tier."""
    for tier, t in tiers.items():
        metric("kvfs_tier_capacity_bytes", "gauge", "capacity of a tier", t["capacity"], tier=tier)
        metric("kvfs_tier_used_bytes", "gauge", "bytes used in a tier", t["used"], tier=tier)
        metric(
            "kvfs_tier_hits_total", "counter", "block accesses a tier served", t["hits"], tier=tier
        )
        metric(
            "kvfs_tier_misses_total",
            "counter",
            "block accesses a tier missed",
            t["misses"],
            tier=tier,
        )
        metric(
            "kvfs_tier_in_bytes_total",
            "counter",
            "bytes placed into a tier",
            t["bytes_in"],
            tier=tier,
        )
        metric(
            "kvfs_tier_out_bytes_total",
            "counter",
            "bytes read out of a tier",
            t["bytes_out"],
            tier=tier,
        )
        metric(
            "kvfs_tier_evictions_total",
            "counter",
            "blocks evicted from a tier",
            t["evictions"],
            tier=tier,
        )


def _namespace_metrics(metric: _Metric, namespaces: list[dict]) -> None:
    """Health and I/O of each pool namespace, labelled by its index and path."""
    for ns in namespaces:
        lab = {"namespace": ns["index"], "path": ns["path"]}
        metric(
            "kvfs_namespace_up",
            "gauge",
            "1 if the namespace is healthy",
            1 if ns["state"] == "ok" else 0,
            **lab,
        )
        metric("kvfs_namespace_read_bytes_total", "counter", "bytes read", ns["bytes_read"], **lab)
        metric(
            "kvfs_namespace_written_bytes_total",
            "counter",
            "bytes written",
            ns["bytes_written"],
            **lab,
        )
        metric("kvfs_namespace_errors_total", "counter", "failed I/Os", ns["errors"], **lab)
        metric("kvfs_namespace_inflight", "gauge", "I/Os in flight", ns["inflight"], **lab)


def _latency_metrics(metric: _Metric, latency: dict) -> None:
    """FUSE requests handled and their latency percentiles, labelled by operation."""
    for op, x in latency.items():
        metric("kvfs_requests_total", "counter", "FUSE requests handled", x["count"], op=op)
        for q in ("p50", "p90", "p99"):
            metric(
                "kvfs_request_latency_seconds",
                "gauge",
                "request latency percentiles",
                x[f"{q}_us"] / 1e6,
                op=op,
                quantile=q[1:],
            )


def _file_metrics(metric: _Metric, f: dict) -> None:
    """The file layer's counters (commits, creates, opens) and its open handles."""
    for k in (
        "commits",
        "commit_errors",
        "pool_evictions",
        "creates",
        "opens",
        "passthrough_opens",
        "plain_opens",
    ):
        metric(f"kvfs_{k}_total", "counter", k.replace("_", " "), f[k])
    metric("kvfs_open_handles", "gauge", "open file handles", f["open_handles"])


def _event_metrics(metric: _Metric, ev: dict) -> None:
    """The KV event publisher's counters, present only with [events] on."""
    for k, help_ in (
        ("batches", "KV event batches sent"),
        ("stored", "BlockStored events sent"),
        ("removed", "BlockRemoved events sent"),
        ("dropped_batches", "KV event batches the socket refused"),
        ("replayed_batches", "KV event batches sent again on request"),
    ):
        metric(f"kvfs_events_{k}_total", "counter", help_, ev[k])


def render(st: dict) -> str:
    lines: list[str] = []
    seen: set[str] = set()

    def metric(name: str, kind: str, help_: str, value, **labels) -> None:
        if value is None:
            return
        if name not in seen:
            seen.add(name)
            lines.append(f"# HELP {name} {help_}")
            lines.append(f"# TYPE {name} {kind}")
        lab = ",".join(f'{k}="{_esc(v)}"' for k, v in labels.items())
        lines.append(f"{name}{{{lab}}} {float(value)}" if lab else f"{name} {float(value)}")

    metric("kvfs_up", "gauge", "1 while the daemon serves", 1)
    metric("kvfs_uptime_seconds", "gauge", "seconds since the mount", st["uptime_s"])
    _tier_metrics(metric, st["tiers"])
    _namespace_metrics(metric, st["namespaces"])
    for k in ("issued", "used", "joined", "wasted", "cancelled", "skipped"):
        metric(f"kvfs_prefetch_{k}_total", "counter", f"prefetches {k}", st["prefetch"][k])
    _latency_metrics(metric, st.get("latency", {}))
    _file_metrics(metric, st["files"])
    ev = st.get("events")  # KV events ([events] on)
    if ev is not None:
        _event_metrics(metric, ev)
    return "\n".join(lines) + "\n"


async def serve(
    statistics: Callable[[], dict], host: str, port: int, *, task_status=trio.TASK_STATUS_IGNORED
) -> None:
    """Serve GET /metrics until cancelled."""

    async def handle(stream: trio.SocketStream) -> None:
        try:
            with trio.move_on_after(10):
                data = b""
                while b"\r\n\r\n" not in data and len(data) < 8192:
                    chunk = await stream.receive_some(4096)
                    if not chunk:
                        return
                    data += chunk
                line = data.split(b"\r\n", 1)[0].split()
                if len(line) >= 2 and line[0] == b"GET" and line[1].split(b"?")[0] == b"/metrics":
                    body = render(statistics()).encode()
                    head = (
                        f"HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n"
                        f"Content-Length: {len(body)}\r\n\r\n"
                    ).encode()
                else:
                    body = b"kvfs: GET /metrics\n"
                    head = (
                        f"HTTP/1.0 404 Not Found\r\nContent-Length: {len(body)}\r\n\r\n"
                    ).encode()
                await stream.send_all(head + body)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        finally:
            await stream.aclose()

    listeners = await trio.open_tcp_listeners(port, host=host)
    log.info("metrics on http://%s:%d/metrics", host, port)
    task_status.started()
    await trio.serve_listeners(handle, listeners)
