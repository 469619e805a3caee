"""A node's part in a shared pool: its Redis connection (link, RESP client) and the shared
pool's space. May call space/, catalog/ (its Redis leases) and pool/."""
