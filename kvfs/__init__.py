"""kvfs: a FUSE filesystem that presents LLM KV-cache blocks as files.

Subpackages by role, top-down as the layers (docs/architecture.md); calls go downward, and a
call that must go up is a small protocol passed in at construction:

    fs       the file layer: FUSE operations (translate only), files and directories, the
             control file, direct clients' socket, leases and allocations
    write    writing a file: handles, write sessions, the commit pipeline, and when bytes
             become durable (at close, or by write-back)
    tiers    the cache tiers over the pool: the block store (DRAM and the node-local tier),
             fetches, eviction and admission policies, readahead along prefix chains
    space    pool space: who may write how much where, what is deleted to make room
    pool     the bottom: namespaces (devices or files, Linux AIO), free-space maps,
             striping, superblocks, block memory
    catalog  beside them: durable metadata (names, attributes, each file's committed
             block), in SQLite on one node or in Redis for a shared pool
    cluster  a node's part in a shared pool: its Redis connection and the shared space
    client   what engines import: direct block reads and writes, mount discovery, the
             LMCache, vLLM and SGLang integrations (through files, xattrs and the daemon's
             direct socket, which the mount names)
    cli      the `kvfs` command

service.py wires the layers (the one factory); daemon.py runs a mount's lifecycle.
"""

__version__ = "0.1.0"
