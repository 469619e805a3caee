"""What engines import: direct block reads and writes (kvfs.client.direct), mount discovery,
and the LMCache, vLLM and SGLang integrations. Talks to a mount only through files and xattrs."""
