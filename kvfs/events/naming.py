"""Naming rules: which files hold KV blocks, and the block each one holds.

A rule is a regular expression over the last few components of a file's path (the file's own
name last), with named groups: `hash` (hex digits, required: the block hash; its last 16
digits are the 64-bit hash vLLM announces, as `maybe_convert_block_hash` does with
VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1, vLLM's default), and optionally `group` (the KV cache
group index) and `model`.

vLLM's fs tier (vllm/v1/kv_offload/file_mapper.py) names a block
`<root>/<safe_model_name>_<12 hex digits>_r<rank>/<hhh>/<hh>_g<group>/<hash_hex>.bin`, written
as `<hash_hex>.bin.tmp` and renamed: only the final name is a block.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

VLLM_FS = (
    r"(?P<model>.+)_[0-9a-f]{12}_r[0-9]+/[0-9a-f]{3}/[0-9a-f]{2}_g(?P<group>[0-9]+)"
    r"/(?P<hash>[0-9a-f]{16,})\.bin"
)
LAYOUTS = {"vllm": VLLM_FS}


@dataclass(frozen=True, slots=True)
class BlockKey:
    """A block as the routers know it: its 64-bit hash, KV cache group and model (the model
    picks the topic, kvfs/events/publisher.py)."""

    hash: int
    group: int | None
    model: str


class NamingRule:
    """A compiled rule: `match(name)` is the cheap test of a file's own name (made for every
    changed file), `key(names)` the block of a path's last `depth` components."""

    def __init__(self, pattern: str):
        parts = pattern.split("/")
        self.depth = len(parts)
        try:
            self._path = re.compile(pattern.encode())
            self._name = re.compile(parts[-1].encode())
        except re.error as e:
            raise ValueError(f"naming rule {pattern!r}: {e}") from None
        if "hash" not in self._path.groupindex:
            raise ValueError(f"naming rule {pattern!r}: it has no (?P<hash>...) group")
        self.pattern = pattern

    @classmethod
    def named(cls, layout: str, pattern: str | None = None) -> "NamingRule":
        """The rule of a known layout ("vllm"), or `pattern` when given."""
        if pattern:
            return cls(pattern)
        if layout not in LAYOUTS:
            raise ValueError(f"unknown layout {layout!r} (known: {', '.join(sorted(LAYOUTS))})")
        return cls(LAYOUTS[layout])

    def match(self, name: bytes) -> bool:
        return self._name.fullmatch(name) is not None

    def key(self, names: list[bytes] | tuple[bytes, ...]) -> BlockKey | None:
        """The block of a file whose path ends in `names` (outermost first), or None."""
        if len(names) < self.depth:
            return None
        m = self._path.fullmatch(b"/".join(names[-self.depth :]))
        if m is None:
            return None
        h = m.group("hash")
        if len(h) > 16:
            h = h[-16:]
        try:
            value = int(h, 16)
        except ValueError:
            return None
        g = m.groupdict().get("group")
        model = m.groupdict().get("model")
        return BlockKey(
            value,
            int(g) if g is not None else None,
            model.decode(errors="replace") if model is not None else "",
        )
