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
free space (kvfs's statvfs) before kvfs has to; see the README. A batch of pages (batch_get,
batch_set) is one kvfs.client.direct batch: two requests to the daemon for all of them.

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
        """Read every page in one kvfs.client.direct batch (all stripe units of all pages at
        once); a page that is gone (evicted, removed) or of another size is a miss (None),
        never wrong bytes."""
        suffixed = [self._get_suffixed_key(k) for k in keys]
        paths = [self._path(s) for s in suffixed]
        bufs = [self._bytes(t) for t in target_locations]
        try:
            got = self._direct.read_many(paths, bufs, return_exceptions=True)
        except OSError as e:  # the daemon could not be asked: every page is a miss
            got = [e] * len(keys)
        out: List[torch.Tensor | None] = []
        for key, s, target, buf, size in zip(keys, suffixed, target_locations, bufs, got):
            if isinstance(size, Exception):
                self._miss(key, s, str(size))
                out.append(None)
            elif size != len(buf):
                self._miss(key, s, f"{size} bytes stored, {len(buf)} expected")
                out.append(None)
            else:
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
        return self.batch_set([key], [value])

    def batch_set(
        self,
        keys: List[str],
        values: Optional[Any] = None,
        target_locations: Optional[Any] = None,
        target_sizes: Optional[Any] = None,
    ) -> bool:
        """HiCacheFile.batch_set, storing the pages not stored yet in one kvfs.client.direct
        batch (each committed under a temporary name and renamed into place, as
        HiCacheFile's tmp-then-rename does). True if every page is stored; a page that fails
        is logged and left out (SGLang's contract), the others are stored."""
        ok, todo = True, []
        for key, value in zip(keys, values):
            suffixed = self._get_suffixed_key(key)
            path = self._path(suffixed)
            if self.exists(key):
                self._evictor.touch(suffixed, path)
                continue
            try:
                data = self._bytes(value.contiguous())
            except Exception as e:  # noqa: BLE001 - SGLang's contract: False, and a log line
                log.error("kvfs: storing page %s failed: %s", key, e)
                ok = False
                continue
            if not self._evictor.reserve(suffixed, data.nbytes, key=key):
                ok = False
                continue
            todo.append((key, suffixed, path, data))
        if not todo:
            return ok
        try:
            got = self._direct.write_many(
                [path for _, _, path, _ in todo],
                [data for _, _, _, data in todo],
                return_exceptions=True,
            )
        except OSError as e:  # the daemon could not be asked: no page is stored
            got = [e] * len(todo)
        for (key, suffixed, _, _), err in zip(todo, got):
            if err is None:
                self._evictor.commit(suffixed)
                if self.metadata_cache is not None:
                    self.metadata_cache.add(suffixed)
                continue
            log.error("kvfs: storing page %s failed: %s", key, err)
            ok = False
            self._evictor.abort(suffixed)
            if self.metadata_cache is not None:
                self.metadata_cache.remove(suffixed)
        return ok

    def close(self) -> None:
        self._direct.close()
