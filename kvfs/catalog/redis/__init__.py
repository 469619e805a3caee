"""The catalog of a pool shared by several nodes, kept in Redis (see catalog.py)."""

from kvfs.catalog.redis.catalog import RedisCatalog

__all__ = ["RedisCatalog"]
