"""The pool: namespaces (devices, Linux AIO), free-space maps, striping, superblocks, and block
memory (buffers). Calls nothing of kvfs above it: the bottom layer."""
