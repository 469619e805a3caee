"""Durable metadata: names, attributes, xattrs and the committed version (block) of each file."""

from kvfs.catalog.records import CONTROL_INO, ROOT_INO, BlobRec, Node
from kvfs.catalog.sqlite import SqliteCatalog

__all__ = ["ROOT_INO", "CONTROL_INO", "BlobRec", "Node", "SqliteCatalog"]
