"""vLLM's KV event wire format (vllm/distributed/kv_events.py, vLLM 0.32), encoded the way
vLLM's own msgspec classes encode it: a batch is an array [ts, events, data_parallel_rank]
(the rank left out when None); an event is a map tagged {"type": "<class name>", ...} holding
every field without a default, even when null, and those with a default only when they differ
from it. tests/unit/test_events.py checks the bytes against vLLM's own encoder.

kvfs's events are vLLM's fs tier's "placeholder" ones: one block hash each, no token ids,
parent or block size (a file's name carries only its hash), medium "STORAGE".
"""

from __future__ import annotations

import msgspec

MEDIUM_STORAGE = "STORAGE"
END_SEQ = (-1).to_bytes(8, "big", signed=True)  # the replay's end marker (vLLM's)


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(KVCacheEvent):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int | bytes]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


def stored(hash64: int, group: int | None, locality: str | None) -> BlockStored:
    return BlockStored(
        block_hashes=[hash64],
        parent_block_hash=None,
        token_ids=[],
        block_size=0,
        lora_id=None,
        medium=MEDIUM_STORAGE,
        lora_name=None,
        group_idx=group,
        locality=locality,
    )


def removed(hash64: int, group: int | None, locality: str | None) -> BlockRemoved:
    return BlockRemoved(
        block_hashes=[hash64], medium=MEDIUM_STORAGE, group_idx=group, locality=locality
    )


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(KVEventBatch)


def encode(batch: KVEventBatch) -> bytes:
    return _encoder.encode(batch)


def decode(payload: bytes) -> KVEventBatch:
    """A batch as vLLM's subscribers decode it (msgspec.DecodeError on anything else)."""
    return _decoder.decode(payload)
