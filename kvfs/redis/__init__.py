"""The Redis transport: a RESP client (resp.py) and a node's link to a Redis master (link.py:
a small pool of connections, Sentinel, reconnects, replica acknowledgements). Used by the
shared catalog (catalog/redis/) and the shared pool's space (cluster/); calls nothing of kvfs
but errors and the configuration."""
