"""kvfs: a FUSE filesystem that presents LLM KV-cache blocks as files.

Layers, top-down (see docs/architecture.md):

    fuse_ops   translate FUSE requests (pyfuse3) into calls below; nothing else
    files      open files: handles, write sessions, commit on close/fsync
    catalog    durable metadata: names, attributes, block versions (SQLite)
    store      block placement and caching: the DRAM tier, fetches, eviction
    pool       striped I/O over the namespaces (block devices or files)
"""

__version__ = "0.1.0"
