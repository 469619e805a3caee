"""What engines import: direct block reads and writes (kvfs.client.direct), mount discovery,
and the LMCache, vLLM and SGLang integrations. Talks to a mount only through files, xattrs and
the daemon's direct socket, which the mount names (channel.py; its messages: wire.py)."""
