"""The cache tiers over the pool: the block store (DRAM and the node-local tier), fetches,
eviction and admission policies, readahead along prefix chains. May call pool/ and catalog/."""
