"""A subscriber of a KV event stream (kvfs's, or vLLM's own: the format is the same): what
`kvfs events` prints and the tests read. It counts gaps in the sequence (batches lost by a
slow subscriber, or sent before it joined) and can ask the replay endpoint for them."""

from __future__ import annotations

import time

import zmq

from kvfs.events import wire


def connectable(endpoint: str) -> str:
    """The address a subscriber connects to for a publisher's endpoint (a wildcard bind
    `tcp://*:5557` is reached at 127.0.0.1)."""
    return endpoint.replace("://*:", "://127.0.0.1:").replace("://0.0.0.0:", "://127.0.0.1:")


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

    def receive(self, timeout: float) -> tuple[bytes, int, wire.KVEventBatch] | None:
        """The next batch (topic, sequence number, batch), or None after `timeout` seconds."""
        if not self.sub.poll(int(timeout * 1000)):
            return None
        topic, seq, payload = self.sub.recv_multipart()
        n = int.from_bytes(seq, "big")
        if self.next_seq is not None and n > self.next_seq:
            self.gaps += 1
            self.missed += n - self.next_seq
        self.next_seq = n + 1
        return topic, n, self.decode(payload)

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
