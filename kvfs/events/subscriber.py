"""A subscriber of a KV event stream (kvfs's, or vLLM's own: the format is the same): what
`kvfs events` prints and the tests read. It counts gaps in the sequence (batches lost by a
slow subscriber, or sent before it joined) and can ask the replay endpoint for them.

`follow` is what a router must do with the sequence (docs/configuration.md, "KV events"). A
publisher numbers its batches from 0 at each start and begins with `AllBlocksCleared` and its
inventory, sent at once: a subscriber connected across the restart reconnects later than
that (ZMQ reconnects after 100 ms or more) and misses them, seeing the sequence go backwards
(2 after 53) or, past a large inventory, jump ahead. Either way what it knew of the node may
be stale. A batch is known for its sequence number and its `ts` (the publisher's clock when
sent): the replay of the last batch seen tells a gap (the same batch again: replay the rest)
from a restart (another batch, or none: the new stream, replayed from 0). Without a replay
endpoint, or once the batches are no longer buffered, nothing tells what was lost: every
block the publisher announced must be taken as gone, and learnt again as it is announced.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import zmq

from kvfs.events import wire

Batch = tuple[bytes, int, wire.KVEventBatch]  # (topic, sequence number, batch)


def connectable(endpoint: str) -> str:
    """The address a subscriber connects to for a publisher's endpoint (a wildcard bind
    `tcp://*:5557` is reached at 127.0.0.1)."""
    return endpoint.replace("://*:", "://127.0.0.1:").replace("://0.0.0.0:", "://127.0.0.1:")


@dataclass(frozen=True)
class Recovery:
    """What `follow` found wrong with the sequence, and did about it. `kind`: "restart" (the
    publisher started again), "gap" (batches lost, replayed) or "lost" (batches lost and not
    to be had again). With `cleared`, every block the publisher announced before is gone (the
    batches returned with it, a replay from 0, announce what it holds now)."""

    kind: str
    seq: int  # the sequence number received
    expected: int  # the one expected
    replayed: int  # batches the replay gave besides the one received

    @property
    def cleared(self) -> bool:
        return self.kind != "gap"

    def __str__(self) -> str:
        where = f"sequence {self.seq} after {self.expected - 1}"
        if self.kind == "gap":
            return f"{where}: {self.seq - self.expected} batch(es) missed, replayed"
        gone = "every block announced before is gone"
        what = "publisher restarted" if self.kind == "restart" else "batches lost, not replayable"
        if self.replayed:
            return f"{what} ({where}): {gone}; its stream replayed from 0"
        return f"{what} ({where}): {gone}, known again as announced"


class Subscriber:
    def __init__(
        self,
        endpoint: str,
        topic: bytes = b"",
        replay_endpoint: str | None = None,
        decode=wire.decode,
    ):
        """`decode`: payload -> batch (default kvfs's copy of vLLM's classes; the tests pass
        vLLM's own decoder)."""
        self.decode = decode
        self.topic = topic
        self._ctx = zmq.Context.instance()
        self.sub = self._ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.setsockopt(zmq.RCVHWM, 0)
        self.sub.connect(connectable(endpoint))
        self.sub.setsockopt(zmq.SUBSCRIBE, topic)
        self.replay_endpoint = connectable(replay_endpoint) if replay_endpoint else None
        self.next_seq: int | None = None  # the sequence number expected next
        self.gaps = 0  # gaps seen in the sequence
        self.missed = 0  # batches those gaps left out
        self.restarts = 0  # publisher restarts seen (the sequence went backwards, or `follow`)
        self._last: tuple[int, float] | None = None  # (seq, ts) of the last batch taken
        self._dupes: dict[int, float] = {}  # replayed batches the socket may still bring

    def _recv(self, timeout: float) -> Batch | None:
        if not self.sub.poll(int(timeout * 1000)):
            return None
        topic, seq, payload = self.sub.recv_multipart()
        return topic, int.from_bytes(seq, "big"), self.decode(payload)

    def _took(self, seq: int, ts: float) -> None:
        self.next_seq = seq + 1
        self._last = (seq, ts)

    def receive(self, timeout: float) -> Batch | None:
        """The next batch (topic, sequence number, batch), or None after `timeout` seconds:
        as it came, the sequence only counted (`follow` acts on it)."""
        got = self._recv(timeout)
        if got is None:
            return None
        n = got[1]
        if self.next_seq is not None and n > self.next_seq:
            self.gaps += 1
            self.missed += n - self.next_seq
        elif self.next_seq is not None and n < self.next_seq:
            self.restarts += 1
        self._took(n, got[2].ts)
        return got

    def receive_all(self, quiet: float = 0.3, limit: float = 30.0) -> list:
        """Every batch until none came for `quiet` seconds (at most `limit` seconds)."""
        out = []
        end = time.monotonic() + limit
        while time.monotonic() < end:
            got = self.receive(quiet)
            if got is None:
                break
            out.append(got)
        return out

    def follow(self, timeout: float) -> tuple[Recovery | None, list[Batch]] | None:
        """The next batches in order, or None after `timeout` seconds: normally the one
        received; after a gap or a restart (see the module doc) what the replay endpoint
        gives back, with a `Recovery` saying what happened (with `cleared`: forget every block
        the publisher announced before these batches). Batches the replay gave are not
        given again when the socket brings them."""
        end = time.monotonic() + timeout
        while True:
            got = self._recv(max(0.0, end - time.monotonic()))
            if got is None:
                return None
            _, n, batch = got
            if self._dupes:
                if self._dupes.get(n) == batch.ts:
                    del self._dupes[n]
                    continue
                self._dupes.clear()
            expected = self.next_seq
            if expected is None or n == expected:
                self._took(n, batch.ts)
                return None, [got]
            return self._recover(got, expected)

    def _recover(self, got: Batch, expected: int) -> tuple[Recovery | None, list[Batch]]:
        _, n, batch = got
        backwards = n < expected
        if self.replay_endpoint is not None:
            try:
                last = self._last
                if not backwards and last is not None:
                    again = self.replay(last[0])
                    if again and again[0][1] == last[0] and again[0][2].ts == last[1]:
                        return self._replayed("gap", got, expected, again[1:])
                stream = self.replay(0)
                if stream and stream[0][1] == 0:
                    return self._replayed("restart", got, expected, stream)
            except TimeoutError:
                pass  # (no answer: as without a replay endpoint)
        elif self.topic and not backwards:
            # another topic's batches make gaps too: only a replay could tell a loss
            self._gap(n, expected)
            self._took(n, batch.ts)
            return None, [got]
        if backwards:
            self.restarts += 1
        else:
            self._gap(n, expected)
        self._took(n, batch.ts)
        return Recovery("restart" if backwards else "lost", n, expected, 0), [got]

    def _gap(self, n: int, expected: int) -> None:
        self.gaps += 1
        self.missed += n - expected

    def _replayed(
        self, kind: str, got: Batch, expected: int, batches: list[Batch]
    ) -> tuple[Recovery | None, list[Batch]]:
        """Take the replayed `batches` (those from where the stream went wrong: the received
        one among them) in place of the received one."""
        _, n, _ = got
        if not batches or batches[-1][1] < n:
            batches = batches + [got]  # (not buffered any more: cannot be, but in order)
        self._dupes = {s: b.ts for _, s, b in batches if s > n}
        self._took(batches[-1][1], batches[-1][2].ts)
        mine = [b for b in batches if b[0].startswith(self.topic)]
        if kind == "restart":
            self.restarts += 1
        else:
            self._gap(n, expected)
            if not any(s < n for _, s, _ in mine):
                return None, mine  # the batches missed were other topics'
        return Recovery(kind, n, expected, sum(s != n for _, s, _ in mine)), mine

    def start_from(self, start: int, timeout: float = 10.0) -> list[Batch]:
        """The batches still buffered from sequence number `start` on, of this subscriber's
        topic, taken as received (`follow` goes on after them)."""
        batches = self.replay(start, timeout)
        if batches:
            self._dupes = {s: b.ts for _, s, b in batches}
            self._took(batches[-1][1], batches[-1][2].ts)
        return [b for b in batches if b[0].startswith(self.topic)]

    def replay(self, start: int, timeout: float = 10.0) -> list:
        """The batches the publisher still buffers from sequence number `start` on."""
        if self.replay_endpoint is None:
            raise ValueError("no replay endpoint")
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.connect(self.replay_endpoint)
            sock.send_multipart((b"", start.to_bytes(8, "big")))
            out = []
            while True:
                if not sock.poll(int(timeout * 1000)):
                    raise TimeoutError(f"replay from {start}: no end marker in {timeout} s")
                _, topic, seq, payload = sock.recv_multipart()
                if seq == wire.END_SEQ:
                    return out
                out.append((topic, int.from_bytes(seq, "big"), self.decode(payload)))
        finally:
            sock.close()

    def close(self) -> None:
        self.sub.close()


def describe(event) -> dict:
    """One event as a JSON-friendly dict: its type and the fields that are set."""
    out = {"type": type(event).__name__}
    for f in event.__struct_fields__:
        v = getattr(event, f)
        if v is not None and v != []:
            out[f] = v
    return out
