"""How catalog records are stored in Redis hashes (field names are short: a pool holds millions).

Node `n:<ino>`:  p parent · n name · c readdir cookie · m mode · u uid · g gid · a atime_ns ·
                 t mtime_ns · k ctime_ns · d (present: a directory) · s symlink target ·
                 b block id (a file's committed version) · x:<name> a user.* xattr ·
                 r priority and q uses in the pool's order (pool.evict = "prefix") ·
                 w the file its writer wrote before it (a chain's write link, carried with
                 the file's first publish; "0": removed since: RedisMirror._write_link)
Block `b:<id>`:  z size · u stripe unit · N namespaces · O offsets · S checksums (packed arrays,
                 see Layout.pack) · c created_ns · i the inode it was committed for
Packed (schema 2): the publish script stores a block's fields as its hash's one field `*`
                 (`pack`), and a new file's as `*` beside `p`, `n` and `b` (which the scripts
                 read); a field set later is stored on its own and overrides the packed one
                 (`record`). Directories, symlinks and xattrs are stored field by field.
Directory `d:<ino>`: name -> child inode.   Chains `l:<ino>`: successor -> "source weight".
Change log `log` entries: o origin epoch · i inodes changed · r blocks retired (in the grave) ·
                 g blocks purged; then the records a publish (or the links script)
                 wrote (`parse_entry`), a publish's each one field whose value is the
                 fields packed (`pack`): @N<ino> the node's whole hash (a new file) ·
                 @U<ino> the fields a new version changed · @B<id> the block record; and
                 @- <ino> (a file it replaced, gone) · @t "<ino> <time>" (a directory's
                 new mtime and ctime) · @l <ino> [succ "source weight"]* (a predecessor's
                 chain links, all of them)
docs/cluster.md has the other keys (atime, grave, lease:<r>, epoch, meta, init, lock:<name>).
"""

from __future__ import annotations

import msgspec

from kvfs.catalog.records import BlobRec, Node
from kvfs.pool.layout import Layout


def node_fields(node: Node) -> list:
    f: list = [
        b"p",
        node.parent,
        b"n",
        node.name,
        b"c",
        node.cookie,
        b"m",
        node.mode,
        b"u",
        node.uid,
        b"g",
        node.gid,
        b"a",
        node.atime_ns,
        b"t",
        node.mtime_ns,
        b"k",
        node.ctime_ns,
    ]
    if node.children is not None:
        f += [b"d", 1]
    if node.target is not None:
        f += [b"s", node.target]
    if node.blob is not None:
        f += [b"b", node.blob.id]
    f += score_fields(node)
    for name, value in node.xattrs.items():
        f += [b"x:" + name, value]
    return f


def score_fields(node: Node) -> list:
    """The file's place in the pool's order, if it has one (pool.evict = "prefix")."""
    return [b"r", repr(node.prio), b"q", node.uses] if node.prio is not None else []


def blob_fields(rec: BlobRec, ino: int) -> list:
    ns, offs, sums = rec.layout.pack()
    return [
        b"z",
        rec.layout.size,
        b"u",
        rec.layout.unit,
        b"N",
        ns,
        b"O",
        offs,
        b"S",
        sums,
        b"c",
        rec.created_ns,
        b"i",
        ino,
    ]


def as_bytes(v) -> bytes:
    """A value as Redis stores it (kvfs.redis.resp sends numbers as their repr)."""
    if isinstance(v, bytes):
        return v
    if isinstance(v, str):
        return v.encode()
    if isinstance(v, bool):
        return b"1" if v else b"0"
    return repr(v).encode()


def pack(fields: list) -> bytes:
    """A record's fields (a flat [k, v, ...] list), packed into one value for the change log:
    a MessagePack array of byte strings, each exactly as Redis stores it in the hash. One
    field per record, where a field per key and value cost Redis 5x the time to send the
    entry to every follower (and the publish script 1.5x its own: docs/cluster.md)."""
    return _encode([as_bytes(v) for v in fields])


_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(list[bytes]).decode


def unpack(value: bytes) -> dict[bytes, bytes]:
    return pairs(_decode(value))


def publish_args(
    ino: int,
    parent: int,
    name: bytes,
    kind: bytes,
    regions: str,
    bid: int,
    ghost: bytes | str,
    prio: float | None,
    blob: list,
    fields: list,
) -> list:
    """One file's arguments to the PUBLISH script (kvfs/catalog/redis/lua/publish.lua): the
    block record and the node's fields packed, and the node's fields one by one where they
    must be stored so (a new version's changed fields; a new file's xattrs, which
    `removexattr` deletes one by one: a packed field cannot be deleted)."""
    single = kind != b"new" or any(k[:2] == b"x:" for k in fields[::2])
    each = fields if single else []
    return [
        *(ino, parent, name, kind, regions, bid, ghost, b"" if prio is None else repr(prio)),
        *(pack(blob), pack(fields), len(each) // 2, *each),
    ]


def record(flat: list | None) -> dict[bytes, bytes]:
    """A node's or a block's HGETALL reply as a dict: its packed fields (`*`, written by the
    publish script) expanded, and the fields stored one by one over them (set since: they are
    newer). A record written field by field (a directory, a symlink, a catalog of schema 1)
    has no `*`."""
    h = pairs(flat)
    packed = h.pop(b"*", None)
    if packed is None:
        return h
    out = unpack(packed)
    out.update(h)
    return out


def pairs(flat: list | None) -> dict[bytes, bytes]:
    """A flat HGETALL reply as a dict."""
    if not flat:
        return {}
    return dict(zip(flat[::2], flat[1::2]))


def parse_entry(flat: list) -> tuple[dict[bytes, bytes], list[tuple[bytes, bytes, dict]]]:
    """A change-log entry: its own fields, and the records it carries, each (tag, id, fields)
    (the entry is a flat list of pairs; a record is either one pair, "@N<id>", "@U<id>" or
    "@B<id>" and its packed fields (tag b"@n", b"@u", b"@b"), or a pair whose field starts
    with "@" followed by its fields' pairs up to the next record)."""
    head: dict[bytes, bytes] = {}
    records: list[tuple[bytes, bytes, dict]] = []
    fields: dict[bytes, bytes] = head
    for i in range(0, len(flat) - 1, 2):
        k, v = flat[i], flat[i + 1]
        if k[:1] == b"@":
            if k[1:2] in _PACKED:
                records.append((_PACKED[k[1:2]], k[2:], unpack(v)))
                fields = head
                continue
            fields = {}
            records.append((k, v, fields))
        else:
            fields[k] = v
    return head, records


_PACKED = {b"N": b"@n", b"U": b"@u", b"B": b"@b"}


def parse_blob(bid: int, h: dict[bytes, bytes]) -> BlobRec:
    return BlobRec(
        bid, Layout.unpack(int(h[b"z"]), int(h[b"u"]), h[b"N"], h[b"O"], h[b"S"]), int(h[b"c"])
    )


def parse_node(ino: int, h: dict[bytes, bytes]) -> Node:
    node = Node(
        ino,
        int(h[b"p"]),
        h[b"n"],
        int(h[b"m"]),
        int(h[b"u"]),
        int(h[b"g"]),
        int(h[b"a"]),
        int(h[b"t"]),
        int(h[b"k"]),
        cookie=int(h[b"c"]),
        target=h.get(b"s"),
        persisted=True,
    )
    node.xattrs = {k[2:]: v for k, v in h.items() if k.startswith(b"x:")}
    if b"r" in h:
        node.prio, node.uses = float(h[b"r"]), int(h.get(b"q", 0))
    if b"d" in h:
        node.children = {}
    return node


def stream_id(sid: bytes) -> tuple[int, int]:
    a, _, b = sid.partition(b"-")
    return int(a), int(b or 0)


def ids(value: bytes | None) -> list[int]:
    return [int(x) for x in value.split()] if value else []
