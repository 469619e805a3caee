"""The publisher: kvfs's KV events on a ZMQ PUB socket, with vLLM's replay protocol.

Frames are vLLM's: [topic, 8-byte big-endian sequence number, msgpack KVEventBatch]. One
sequence counts every batch this daemon sends (from 0 at each start, as vLLM's: a subscriber
connected across a restart misses its first batches, ZMQ's reconnection being slower than
the start, and sees the sequence go backwards or jump; it then asks the replay endpoint for
the new stream from 0, or treats the node's blocks as gone: kvfs/events/subscriber.py,
`Subscriber.follow`); the topic
is the configured template (default `kv@{node}@{model}`, llm-d's form) with the configured
model, or else each block's model as its path names it, so a pool holding blocks of two
models sends on two topics (a subscriber of the prefix `kv@<node>@` sees every batch, and no
gap in the sequence but a lost one). An event of no model (the start's `AllBlocksCleared`)
goes once, on the node's topic: the template with the configured model, or else with an empty
one (`kv@<node>@` with the default template: a prefix of each of the node's topics when
the template ends with {model}, so a subscriber of `kv@<node>@`,
`kv@` as llm-d's or "" as vLLM's example and Dynamo's by default, gets it once, and reads its
empty model as "every model of that node"). A subscriber of one model's topic alone does not
get it, and learns of a restart from the sequence (docs/configuration.md, "KV events").

Where it runs: on the trio thread, in the catalog's commit round (`durable`: called once the
changes it lists are durable; kvfs/catalog/announce.py, `Announcer`). Sending never waits: a PUB
socket queues each message to every subscriber up to its high-water mark and drops it for a
subscriber that is that far behind, which that subscriber sees as a gap in the sequence;
`replay_endpoint` then serves the batches it missed from the replay buffer (the last
`buffer_steps` batches), as vLLM's publisher does: a request [b"", start sequence] from a
DEALER or REQ socket gets every buffered batch from that number on, then [b"", -1, b""].

After a start, the stream begins with `AllBlocksCleared` followed by `BlockStored` for every
block the pool holds (`resync`): a crash between a change and its announcement loses the
announcement, and only a fresh inventory makes the stream true again (docs/configuration.md,
"KV events").
"""

from __future__ import annotations

import collections
import logging
import os
import time
from typing import Iterable

import trio
import zmq

from kvfs.events import wire
from kvfs.events.naming import BlockKey, NamingRule

log = logging.getLogger("kvfs.events")

RESYNC_BATCH = 1000  # blocks per batch of the inventory sent at a start
LINGER_MS = 1000  # at close: how long queued batches may still go out

# Fault injection for the crash tests (tests/mounted/test_kv_events.py): "stored:S" or
# "removed:S" stalls the daemon S seconds (blocking its trio thread) before announcing a batch
# of durable changes with a store (a removal) in it, so that a kill -9 lands between a change
# made durable and its announcement.
_STALL = os.environ.get("KVFS_TEST_EVENTS_STALL", "")


def _binds(endpoint: str) -> bool:
    """vLLM's rule: bind wildcard, ipc and inproc endpoints; connect to the rest."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


class Publisher:
    """Announces the catalog's durable changes to recognised names (see the module doc).
    Its `depth`, `match` and `key` are the naming rule's: the catalog asks them of a changed
    file's name and path."""

    def __init__(
        self,
        *,
        endpoint: str,
        rule: NamingRule,
        node: str,
        locality: str | None,
        topic: str = "kv@{node}@{model}",
        model: str = "",
        replay_endpoint: str | None = None,
        buffer_steps: int = 10_000,
        hwm: int = 100_000,
    ):
        self.rule = rule
        self.depth = rule.depth
        self.match = rule.match
        self.key = rule.key
        self.node = node
        self.locality = locality
        self.model = model
        self._template = topic
        self._topics: dict[str, bytes] = {}
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self._ctx = zmq.Context(io_threads=1)
        self._pub = self._ctx.socket(zmq.PUB)
        self._replay: zmq.Socket | None = None
        try:
            self._pub.setsockopt(zmq.SNDHWM, hwm)
            self._pub.setsockopt(zmq.LINGER, LINGER_MS)
            if _binds(endpoint):
                self._pub.bind(endpoint)
            else:
                self._pub.connect(endpoint)
            if replay_endpoint:
                self._replay = self._ctx.socket(zmq.ROUTER)
                self._replay.setsockopt(zmq.LINGER, LINGER_MS)
                self._replay.setsockopt(zmq.SNDHWM, max(hwm, buffer_steps + 2))
                self._replay.bind(replay_endpoint)
        except zmq.ZMQError as e:
            self.close()
            raise ValueError(f"events: cannot open {endpoint!r}: {e}") from None
        self._buffer: collections.deque[tuple[int, bytes, bytes]] = collections.deque(
            maxlen=buffer_steps
        )
        self.seq = 0  # the next batch's sequence number
        self.batches = 0
        self.stored = 0
        self.removed = 0
        self.cleared = 0
        self.dropped = 0  # batches the socket refused (they stay in the replay buffer)
        self.replays = 0
        self.replayed = 0
        self.resynced = 0  # blocks announced by the inventory at the start
        self.cpu_s = 0.0  # the trio thread's CPU time announcing (the catalog adds its part)

    # ------------------------------------------------------------------------------ sending
    def topic(self, model: str) -> bytes:
        """The topic of a block of `model` (its path's; "" for the node's topic: see the
        module doc)."""
        t = self._topics.get(model)
        if t is None:
            t = self._topics[model] = self._template.format(
                node=self.node, model=self.model or model
            ).encode()
        return t

    def _send(self, topic: bytes, events: list, ts: float | None = None) -> None:
        payload = wire.encode(
            wire.KVEventBatch(ts=time.time() if ts is None else ts, events=events)
        )
        seq = self.seq
        self.seq += 1
        self.batches += 1
        self._buffer.append((seq, topic, payload))
        try:
            self._pub.send_multipart((topic, seq.to_bytes(8, "big"), payload), flags=zmq.NOBLOCK)
        except zmq.Again:
            self.dropped += 1
        except zmq.ZMQError as e:
            self.dropped += 1
            log.warning("events: batch %d not sent: %s", seq, e)

    def durable(self, changes: list[tuple[bool, BlockKey]]) -> None:
        """Announce changes made durable, in the order they were made: (stored?, block). A
        removal directly followed by a store of the same block (a name replaced by a new
        version of itself) is announced as the store alone: the name was never absent."""
        if _STALL:
            self._stall(changes)
        t = time.thread_time()
        out: list[tuple[bool, BlockKey] | None] = []
        last: dict[BlockKey, int] = {}
        for stored, k in changes:
            i = last.get(k)
            if stored and i is not None and out[i] is not None and not out[i][0]:
                out[i] = None
            last[k] = len(out)
            out.append((stored, k))
        by_topic: dict[bytes, list] = {}
        loc = self.locality
        for c in out:
            if c is None:
                continue
            stored, k = c
            if stored:
                ev = wire.stored(k.hash, k.group, loc)
                self.stored += 1
            else:
                ev = wire.removed(k.hash, k.group, loc)
                self.removed += 1
            by_topic.setdefault(self.topic(k.model), []).append(ev)
        ts = time.time()
        for topic, events in by_topic.items():
            self._send(topic, events, ts)
        self.cpu_s += time.thread_time() - t

    def resync(self, keys: Iterable[BlockKey]) -> None:
        """At a start: one `AllBlocksCleared` on the node's topic (see the module doc), whatever
        the pool holds, then every block the pool holds, on its topic. One clear, first: a
        router that clears a whole node whatever the topic (Dynamo) must not lose one topic's
        inventory to another topic's clear."""
        self._send(self.topic(""), [wire.AllBlocksCleared()])
        self.cleared += 1
        by_topic: dict[bytes, list] = {}
        for k in keys:
            ev = wire.stored(k.hash, k.group, self.locality)
            by_topic.setdefault(self.topic(k.model), []).append(ev)
        for topic, events in by_topic.items():
            for i in range(0, len(events), RESYNC_BATCH):
                self._send(topic, events[i : i + RESYNC_BATCH])
            self.resynced += len(events)
        log.info(
            "events: publishing on %s%s; announced %d block(s) held",
            self.endpoint,
            f" (replay on {self.replay_endpoint})" if self.replay_endpoint else "",
            self.resynced,
        )

    @staticmethod
    def _stall(changes: list[tuple[bool, BlockKey]]) -> None:
        kind, _, seconds = _STALL.partition(":")
        if any(stored == (kind == "stored") for stored, _ in changes):
            log.warning("events: stalling %s s before announcing (KVFS_TEST_EVENTS_STALL)", seconds)
            time.sleep(float(seconds))

    # ------------------------------------------------------------------------------ replay
    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Answer replay requests (when a replay endpoint is configured)."""
        task_status.started()
        sock = self._replay
        if sock is None:
            return
        fd = sock.getsockopt(zmq.FD)
        while True:
            # the descriptor is edge-triggered: drain what is readable before waiting again
            while sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                try:
                    frames = sock.recv_multipart(flags=zmq.NOBLOCK)
                except zmq.Again:
                    break
                self._answer(sock, frames)
            await trio.lowlevel.wait_readable(fd)

    def _answer(self, sock: zmq.Socket, frames: list[bytes]) -> None:
        if len(frames) != 3 or len(frames[2]) != 8:
            log.warning("events: a replay request of %d frame(s) ignored", len(frames))
            return
        peer, _, start = frames
        first = int.from_bytes(start, "big")
        self.replays += 1
        try:
            for seq, topic, payload in list(self._buffer):
                if seq >= first:
                    sock.send_multipart(
                        (peer, b"", topic, seq.to_bytes(8, "big"), payload), flags=zmq.NOBLOCK
                    )
                    self.replayed += 1
            sock.send_multipart((peer, b"", b"", wire.END_SEQ, b""), flags=zmq.NOBLOCK)
        except zmq.ZMQError as e:  # the requester is gone, or that far behind
            log.warning("events: replay from %d cut short: %s", first, e)

    # ------------------------------------------------------------------------------ the rest
    def statistics(self) -> dict:
        return {
            "endpoint": self.endpoint,
            "replay_endpoint": self.replay_endpoint,
            "next_seq": self.seq,
            "batches": self.batches,
            "stored": self.stored,
            "removed": self.removed,
            "cleared": self.cleared,
            "dropped_batches": self.dropped,
            "replay_requests": self.replays,
            "replayed_batches": self.replayed,
            "resynced_blocks": self.resynced,
            "buffered_batches": len(self._buffer),
            "cpu_s": round(self.cpu_s, 6),
        }

    def close(self) -> None:
        for s in (self._pub, self._replay):
            if s is not None and not s.closed:
                s.close()
        self._ctx.term()
