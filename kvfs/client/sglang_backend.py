"""An SGLang HiCache L3 storage backend on a kvfs mount: SGLang's HiCacheFile (same files, same
`stat` lookups and optional LRU eviction) whose pages are stored and read straight between
SGLang's buffers and the namespaces with kvfs.client.direct, instead of through FUSE.

SGLang (0.5.23) loads it as a dynamic backend:

    --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config '{"backend_name": "kvfs",
        "module_path": "kvfs.client.sglang_backend", "class_name": "KvfsHiCacheStorage",
        "file_storage_path": "/mnt/kvfs/hicache", "min_free_space": "8G"}'

Files written by SGLang's "file" backend and by this one are the same files, so the two can share
a directory. A page that kvfs evicted is a miss at lookup (`exists` stats the file) and at read
(get returns None); SGLang then recomputes it. `min_free_space` makes SGLang evict by the pool's
free space (kvfs's statvfs) before kvfs has to; see the README.

Needs read access to the namespace devices or files (see kvfs.client.direct).
"""

from __future__ import annotations

import logging
import os
from typing import Any, List, Optional

import torch
from sglang.srt.mem_cache.hicache_storage import HiCacheFile, HiCacheStorageConfig

from kvfs.client import direct
from kvfs.client.mounts import find_mount

log = logging.getLogger("kvfs.sglang")


class KvfsHiCacheStorage(HiCacheFile):
    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Optional[dict] = None):
        # SGLang's dynamic loader passes (storage_config, kwargs); HiCacheFile takes the
        # directory from SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR or extra_config
        super().__init__(storage_config)
        extra = storage_config.extra_config or {}
        self._direct = direct.Direct(
            find_mount(os.path.abspath(self.file_path)),
            threads=int(extra.get("kvfs_threads", 16)),
            verify=bool(extra.get("kvfs_verify", True)),
        )

    def _path(self, suffixed: str) -> str:
        return os.path.join(self.file_path, f"{suffixed}.bin")

    @staticmethod
    def _bytes(target: torch.Tensor) -> memoryview:
        return memoryview(target.view(torch.uint8).numpy()).cast("B")

    def _hit(self, suffixed: str) -> None:
        self._evictor.touch(suffixed, self._path(suffixed))
        if self.metadata_cache is not None:
            self.metadata_cache.add(suffixed)

    def _miss(self, key: str, suffixed: str, why: str) -> None:
        if self.metadata_cache is not None:
            self.metadata_cache.remove(suffixed)
        log.debug("kvfs: page %s is a miss: %s", key, why)

    def get(
        self, key: str, target_location: Optional[Any] = None, target_sizes: Optional[Any] = None
    ) -> torch.Tensor | None:
        return self.batch_get([key], [target_location])[0]

    def batch_get(
        self,
        keys: List[str],
        target_locations: List[torch.Tensor],
        target_sizes: Optional[Any] = None,
    ) -> List[torch.Tensor | None]:
        """Read every page in parallel (all stripe units of all pages at once); a page that is
        gone (evicted, removed) or of another size is a miss (None), never wrong bytes."""
        suffixed = [self._get_suffixed_key(k) for k in keys]
        paths = [self._path(s) for s in suffixed]
        bufs = [self._bytes(t) for t in target_locations]
        try:
            sizes = self._direct.read_many(paths, bufs)
        except (OSError, ValueError):
            sizes = None
        out: List[torch.Tensor | None] = []
        for i, (key, s, target) in enumerate(zip(keys, suffixed, target_locations)):
            size = sizes[i] if sizes is not None else None
            if size is None:
                try:
                    size = self._direct.read_into(paths[i], bufs[i])
                except (OSError, ValueError) as e:
                    self._miss(key, s, str(e))
                    out.append(None)
                    continue
            if size != len(bufs[i]):
                self._miss(key, s, f"{size} bytes stored, {len(bufs[i])} expected")
                out.append(None)
                continue
            self._hit(s)
            out.append(target)
        return out

    def set(
        self,
        key: str,
        value: Optional[Any] = None,
        target_location: Optional[Any] = None,
        target_sizes: Optional[Any] = None,
    ) -> bool:
        """HiCacheFile.set, storing the page with a kvfs.client.direct write (committed under a
        temporary name and renamed into place, as HiCacheFile's tmp-then-rename does)."""
        suffixed = self._get_suffixed_key(key)
        path = self._path(suffixed)
        if self.exists(key):
            self._evictor.touch(suffixed, path)
            return True
        reserved = False
        try:
            data = self._bytes(value.contiguous())
            if not self._evictor.reserve(suffixed, data.nbytes, key=key):
                return False
            reserved = True
            self._direct.write(path, data)
            self._evictor.commit(suffixed)
            if self.metadata_cache is not None:
                self.metadata_cache.add(suffixed)
            return True
        except Exception as e:  # noqa: BLE001 - SGLang's contract: False, and a log line
            log.error("kvfs: storing page %s failed: %s", key, e)
            if reserved:
                self._evictor.abort(suffixed)
            if self.metadata_cache is not None:
                self.metadata_cache.remove(suffixed)
            return False

    def close(self) -> None:
        self._direct.close()
