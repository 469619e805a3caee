"""`kvfs events`: subscribe to a mount's KV events and print them, decoded (kvfs/events/).

    kvfs events [--mount DIR | --endpoint tcp://host:5557] [--from SEQ] [--count N]
                [--timeout S] [--topic PREFIX] [--json]

The endpoints come from the mount's statistics (its [events] section) unless given. One line
per batch: sequence number, topic, and each event (type, group, hashes in hex); --json prints
one JSON document per batch instead. --from SEQ first asks the replay endpoint for the
batches buffered from SEQ on. At the end (--count batches, --timeout seconds without one, or
Ctrl-C) a line says how many batches the sequence shows were missed.

The sequence is followed as a router must (kvfs/events/subscriber.py, `Subscriber.follow`):
a sequence going backwards, or jumping, is a restart or a loss; a line starting with "!"
(--json: a document with "notice") says which (for a restart, or a loss the replay cannot
fill: that every block announced before is gone), then come the batches the replay endpoint
gives back (a restart's: from 0, its AllBlocksCleared and inventory).
"""

from __future__ import annotations

import json
import sys

from kvfs.cli.common import CliError, stats, with_json
from kvfs.client.mounts import find_mount


def add_parsers(sub) -> None:
    p = with_json(sub.add_parser("events", help="print the KV events a mount publishes"))
    p.add_argument("--mount", default=".", help="the mount whose [events] to read (default .)")
    p.add_argument("--endpoint", help="the PUB endpoint (default: the mount's)")
    p.add_argument("--replay-endpoint", help="the replay endpoint (default: the mount's)")
    p.add_argument("--from", dest="start", type=int, help="replay the batches from SEQ first")
    p.add_argument("--topic", default="", help="only topics starting with this")
    p.add_argument("--count", type=int, default=0, help="stop after N batches (0: never)")
    p.add_argument("--timeout", type=float, default=0.0, help="stop after S quiet seconds")
    p.set_defaults(func=cmd_events)


def _line(topic: bytes, seq: int, batch) -> str:
    from kvfs.events.subscriber import describe

    parts = [f"#{seq} {topic.decode(errors='replace')} ts={batch.ts:.6f}"]
    for ev in batch.events:
        d = describe(ev)
        kind = d.pop("type")
        hashes = " ".join(
            f"{h:016x}" if isinstance(h, int) else h.hex() for h in d.pop("block_hashes", [])
        )
        extra = "".join(f" {k}={v}" for k, v in d.items() if k in ("group_idx", "medium"))
        parts.append(f"  {kind}{extra} {hashes}".rstrip())
    return "\n".join(parts)


def _doc(topic: bytes, seq: int, batch) -> str:
    from kvfs.events.subscriber import describe

    return json.dumps(
        {
            "seq": seq,
            "topic": topic.decode(errors="replace"),
            "ts": batch.ts,
            "events": [describe(e) for e in batch.events],
        }
    )


def _notice(note, as_json: bool) -> str:
    if as_json:
        return json.dumps(
            {
                "notice": note.kind,
                "seq": note.seq,
                "expected": note.expected,
                "cleared": note.cleared,
                "replayed": note.replayed,
                "message": str(note),
            }
        )
    return f"! {note}"


def cmd_events(args) -> int:
    from kvfs.events.subscriber import Subscriber

    endpoint, replay = args.endpoint, args.replay_endpoint
    if endpoint is None:
        mount = find_mount(args.mount)
        ev = stats(mount).get("events")
        if ev is None:
            raise CliError(f"kvfs at {mount} publishes no KV events ([events] enabled = true)")
        endpoint = ev["endpoint"]
        replay = replay or ev.get("replay_endpoint")
    if args.start is not None and not replay:
        raise CliError("--from needs a replay endpoint ([events] replay_endpoint)")
    show = _doc if args.json else _line
    sub = Subscriber(endpoint, args.topic.encode(), replay)
    n = 0
    try:
        if args.start is not None:
            for got in sub.start_from(args.start):
                print(show(*got), flush=True)
                n += 1
        while not args.count or n < args.count:
            got = sub.follow(args.timeout if args.timeout > 0 else 3600.0)
            if got is None:
                if args.timeout > 0:
                    break
                continue
            note, batches = got
            if note is not None:
                print(_notice(note, args.json), flush=True)
            for b in batches:
                print(show(*b), flush=True)
                n += 1
    except KeyboardInterrupt:
        pass
    finally:
        sub.close()
    print(
        f"{n} batch(es); {sub.missed} missed in {sub.gaps} gap(s); "
        f"{sub.restarts} publisher restart(s)",
        file=sys.stderr,
    )
    return 0
