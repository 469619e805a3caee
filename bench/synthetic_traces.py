"""Synthetic prefix traces with other shapes than the production one, for checking that the
default policy does not fall below LRU elsewhere. Each returns a list of requests (lists of
block ids) in the format bench/trace_replay.py replays."""

from __future__ import annotations

import bisect
import itertools
import random


def zipf_chains(
    n_requests: int = 20000, n_chains: int = 2000, depth: int = 16, s: float = 1.1, seed: int = 1
) -> list[list[int]]:
    """Requests read a prefix of one of many fixed chains, chosen by a Zipf law (hot documents)."""
    rng = random.Random(seed)
    # random.choices(range(n_chains), weights) draw by draw, with the cumulative weights
    # summed once (the same requests; each draw O(log n), so a million chains are cheap)
    cum = list(itertools.accumulate(1 / (i + 1) ** s for i in range(n_chains)))
    total = cum[-1] + 0.0
    out = []
    for _ in range(n_requests):
        c = bisect.bisect(cum, rng.random() * total, 0, n_chains - 1)
        d = rng.randint(1, depth)
        out.append([c * depth + i for i in range(d)])
    return out


def recent_repeat(
    n_requests: int = 20000, depth: int = 12, keep: int = 50, seed: int = 2
) -> list[list[int]]:
    """Strong temporal locality: most requests repeat one of the last `keep` chains."""
    rng = random.Random(seed)
    recent: list[int] = []
    next_chain = 0
    out = []
    for _ in range(n_requests):
        if recent and rng.random() < 0.8:
            c = rng.choice(recent[-keep:])
        else:
            c = next_chain
            next_chain += 1
            recent.append(c)
        out.append([c * depth + i for i in range(depth)])
    return out


def loop(n_requests: int = 12000, n_chains: int = 300, depth: int = 10) -> list[list[int]]:
    """A cyclic scan over more chains than fit (LRU's worst case)."""
    return [[(r % n_chains) * depth + i for i in range(depth)] for r in range(n_requests)]


def sessions(
    n_requests: int = 20000, p_continue: float = 0.6, active: int = 200, seed: int = 3
) -> list[list[int]]:
    """Multi-turn sessions with a different return probability and no shared system prompt;
    every block is full (a session's last block is reused by its next turn)."""
    rng = random.Random(seed)
    ids = iter(range(1, 1 << 62))
    live: list[list[int]] = []
    out = []
    for _ in range(n_requests):
        if live and rng.random() < 0.7:
            i = rng.randrange(len(live))
            chain = live[i] + [next(ids) for _ in range(rng.randint(1, 3))]
            if rng.random() < p_continue:
                live[i] = chain
            else:
                live.pop(i)
        else:
            chain = [next(ids) for _ in range(rng.randint(4, 30))]
            live.append(chain)
            if len(live) > active:
                live.pop(0)
        out.append(chain)
    return out


TRACES = {
    "zipf_chains": zipf_chains,
    "recent_repeat": recent_repeat,
    "loop": loop,
    "sessions": sessions,
}
