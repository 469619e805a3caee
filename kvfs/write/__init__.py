"""Writing a file: open handles and per-inode state, write sessions, the commit pipeline, and
when bytes become durable (at close, or by write-back). May call tiers/, space/, catalog/, pool/."""
