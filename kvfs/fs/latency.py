"""Request latencies per FUSE operation, for percentiles in the statistics."""

from __future__ import annotations

from typing import Callable


class Latency:
    """Request latencies per operation, in power-of-two microsecond buckets (for percentiles)."""

    BUCKETS = 32

    def __init__(self) -> None:
        self.counts: dict[str, list[int]] = {}
        self.maxima: dict[str, float] = {}
        self.cpu: dict[str, float] = {}  # trio-thread CPU seconds in each handler (opt-in)
        # requests answered below kvfs, in pyfuse3's request loop: a count each, in the first bucket
        self._below: dict[str, Callable[[], int]] = {}

    def answered_below(self, op: str, count: Callable[[], int]) -> None:
        self._below[op] = count

    def add_cpu(self, op: str, seconds: float) -> None:
        self.cpu[op] = self.cpu.get(op, 0.0) + seconds

    def record(self, op: str, seconds: float) -> None:
        us = seconds * 1e6
        b = min(self.BUCKETS - 1, max(0, int(us).bit_length()))
        c = self.counts.get(op)
        if c is None:
            c = self.counts[op] = [0] * self.BUCKETS
        c[b] += 1
        if us > self.maxima.get(op, 0.0):
            self.maxima[op] = us

    def summary(self) -> dict:
        out = {}
        counts = dict(self.counts)
        for op, below in self._below.items():
            c = list(counts.get(op, [0] * self.BUCKETS))
            c[0] += below()
            counts[op] = c
        for op, c in counts.items():
            n = sum(c)
            if n == 0:
                continue
            res = {"count": n, "max_us": round(self.maxima.get(op, 0.0), 1)}
            if op in self.cpu:
                res["cpu_us"] = round(self.cpu[op] * 1e6, 1)
            for q, name in ((0.5, "p50_us"), (0.9, "p90_us"), (0.99, "p99_us")):
                acc, target = 0, q * n
                for b, k in enumerate(c):
                    acc += k
                    if acc >= target:
                        res[name] = float(1 << b)  # the bucket's upper bound
                        break
            out[op] = res
        return out
