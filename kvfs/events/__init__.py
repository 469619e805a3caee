"""KV events: what the pool holds, announced to KV-aware routers in vLLM's own wire format.

A router (llm-d's precise prefix-cache scorer, Dynamo's KV router) learns where a prefix is
cached from the engines' KV events: `BlockStored`, `BlockRemoved` and `AllBlocksCleared` on a
ZMQ PUB socket, frames [topic, 8-byte big-endian sequence, msgpack batch], with an optional
ROUTER socket that replays batches from a sequence number (vllm/distributed/kv_events.py).
kvfs knows both sides of a bounded pool: every file made durable and every file evicted,
unlinked or replaced. For files whose path a naming rule recognises (vLLM's fs tier:
`<model>_<digest>_r<rank>/<hhh>/<hh>_g<group>/<hash>.bin`), it announces the block hashes vLLM
would (naming.py), encoded as vLLM's classes encode them (wire.py), on a publisher of its own
(publisher.py).

The catalog (kvfs/catalog) decides *when*: it notes a change to a recognised name as it makes
it and hands the notes over once the change is durable (its announcer, kvfs/catalog/announce.py's
`Announcer`), so nothing announced can be rolled back by a crash. This package only names and
sends; it calls nothing of the layers above or below it.
"""
