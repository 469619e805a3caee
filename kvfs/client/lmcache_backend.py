"""An LMCache storage backend that stores and loads KV chunks with kvfs.client.direct: straight
between LMCache's buffers and the namespaces (into GPU memory where GDS is available), the daemon
only leasing, placing and committing them: a batch of chunks (a batched put or get) is one
kvfs.client.direct batch, two requests to the daemon for all of it.

LMCache (0.5.6) loads it as a storage plugin:

    storage_plugins: ["kvfs"]
    extra_config:
      storage_plugin.kvfs.module_path: kvfs.client.lmcache_backend
      storage_plugin.kvfs.class_name: KvfsBackend
      kvfs.path: /mnt/kvfs/lmcache          # a directory in the mount
      kvfs.verify: true                     # check every unit's checksum on direct reads
                                            # (the default; false opts out)
      kvfs.threads: 8                       # concurrent puts (each a batch)
      kvfs.direct_writes: true              # false: write through the mount (FUSE) instead

Unlike LMCache's local_disk backend it keeps no index of its own: a chunk exists when its file
does (`stat` through the mount), and its shape, dtype and format travel with it as the file's
`user.lmcache.meta` attribute. So chunks survive engine restarts and are shared by every engine
that sees the mount (every node, with a shared pool). Chunks are written to a temporary name
and renamed into place, so a reader never sees a partial one; kvfs makes the content durable
when the commit (or, writing through the mount, the close()) returns.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import os
import threading
from typing import Any, Callable, List, Optional, Sequence

import torch
from lmcache.utils import CacheEngineKey
from lmcache.v1.memory_management import MemoryFormat, MemoryObj
from lmcache.v1.storage_backend.abstract_backend import StoragePluginInterface

from kvfs.client import direct
from kvfs.client.direct import ReadTimeout
from kvfs.client.mounts import find_mount

log = logging.getLogger("kvfs.lmcache")

META_XATTR = "user.lmcache.meta"
_DTYPES = {
    str(t): t
    for t in (torch.bfloat16, torch.float16, torch.float32, torch.uint8, torch.int8, torch.float64)
}
for _name in ("float8_e4m3fn", "float8_e5m2"):
    if hasattr(torch, _name):
        _DTYPES[str(getattr(torch, _name))] = getattr(torch, _name)


class KvfsBackend(StoragePluginInterface):
    def __init__(
        self, config=None, metadata=None, local_cpu_backend=None, loop=None, dst_device: str = "cpu"
    ):
        super().__init__(
            dst_device=dst_device,
            config=config,
            metadata=metadata,
            local_cpu_backend=local_cpu_backend,
            loop=loop,
        )
        extra = (config.extra_config or {}) if config is not None else {}
        path = extra.get("kvfs.path")
        if not path:
            raise ValueError(
                "KvfsBackend: set extra_config['kvfs.path'] to a directory in a kvfs mount"
            )
        self.path = os.path.abspath(path)
        os.makedirs(self.path, exist_ok=True)
        self.mount = find_mount(self.path)
        self.direct = direct.Direct(self.mount, verify=bool(extra.get("kvfs.verify", True)))
        self._writers = concurrent.futures.ThreadPoolExecutor(
            int(extra.get("kvfs.threads", 8)), thread_name_prefix="kvfs-put"
        )
        self.direct_writes = bool(extra.get("kvfs.direct_writes", True))
        self._put_tasks: set[CacheEngineKey] = set()
        self._lock = threading.Lock()

    def __str__(self) -> str:
        return "KvfsBackend"

    # --- names ---------------------------------------------------------------------------------
    def _file(self, key: CacheEngineKey) -> str:
        return os.path.join(self.path, key.to_string().replace("/", "-") + ".pt")

    def contains(self, key: CacheEngineKey, pin: bool = False) -> bool:
        return os.path.exists(self._file(key))

    async def batched_async_contains(
        self, lookup_id: str, keys: List[CacheEngineKey], pin: bool = False
    ) -> int:
        n = 0
        for key in keys:  # a prefix: stop at the first chunk missing
            if not self.contains(key):
                break
            n += 1
        return n

    def exists_in_put_tasks(self, key: CacheEngineKey) -> bool:
        with self._lock:
            return key in self._put_tasks

    # --- writes --------------------------------------------------------------------------------
    def _put_many(
        self,
        keys: list[CacheEngineKey],
        objs: list[MemoryObj],
        callback: Optional[Callable[[CacheEngineKey], None]],
    ) -> None:
        """Store chunks: with direct writes all of them in one kvfs.client.direct batch (two
        requests to the daemon), else each through the mount. A chunk that fails is logged
        and left out (LMCache computes it again)."""
        finals = [self._file(k) for k in keys]
        try:
            metas = [
                json.dumps(
                    {
                        "shape": list(obj.get_shape()),
                        "dtype": str(obj.get_dtype()),
                        "fmt": obj.get_memory_format().name,
                    }
                ).encode()
                for obj in objs
            ]
            if self.direct_writes:
                try:
                    got = self.direct.write_many(
                        finals,
                        [obj.byte_array for obj in objs],
                        xattrs=[{META_XATTR: meta} for meta in metas],
                        return_exceptions=True,
                    )
                except OSError as e:  # the daemon could not be asked: nothing is stored
                    got = [e] * len(keys)
            else:
                got = [self._put_through_mount(f, o, m) for f, o, m in zip(finals, objs, metas)]
            for final, err in zip(finals, got):
                if err is not None:
                    log.error("kvfs: storing %s failed: %s", final, err)
        finally:
            for obj in objs:
                obj.ref_count_down()
            with self._lock:
                self._put_tasks.difference_update(keys)
        if callback is not None:
            for key in keys:
                try:
                    callback(key)
                except Exception:  # noqa: BLE001 - LMCache's callbacks must not break puts
                    log.exception("kvfs: put callback failed")

    @staticmethod
    def _put_through_mount(final: str, obj: MemoryObj, meta: bytes) -> OSError | None:
        tmp = final + f".tmp{threading.get_ident()}"
        try:
            with open(tmp, "wb") as f:
                f.write(obj.byte_array)
                os.setxattr(f.fileno(), META_XATTR, meta)
            os.replace(tmp, final)  # durable once close() returned; visible now
        except OSError as e:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            return e
        return None

    def submit_put_task(
        self, key: CacheEngineKey, obj: MemoryObj, on_complete_callback=None
    ) -> Optional[concurrent.futures.Future]:
        return self.batched_submit_put_task(
            [key], [obj], on_complete_callback=on_complete_callback
        )[0]

    def batched_submit_put_task(
        self,
        keys: Sequence[CacheEngineKey],
        objs: List[MemoryObj],
        transfer_spec: Any = None,
        on_complete_callback=None,
    ):
        """One task stores every chunk of the call not being stored already; its future for
        each of those, None for the others."""
        fresh = []  # (each key: not being stored already)
        with self._lock:
            for key in keys:
                fresh.append(key not in self._put_tasks)
                self._put_tasks.add(key)
        taken = [(k, o) for k, o, f in zip(keys, objs, fresh) if f]
        if not taken:
            return [None] * len(keys)
        for _, obj in taken:
            obj.ref_count_up()
        fut = self._writers.submit(
            self._put_many, [k for k, _ in taken], [o for _, o in taken], on_complete_callback
        )
        return [fut if f else None for f in fresh]

    # --- reads ---------------------------------------------------------------------------------
    def _allocate(self, paths: list[str]) -> list[Optional[MemoryObj]]:
        """A memory object for each chunk, of the shape, dtype and format its file's
        attribute says (one request to the daemon for all of them); None for a chunk that is
        not there."""
        try:
            infos = self.direct.inspect(paths, [META_XATTR])
        except OSError:  # the daemon could not be asked: every chunk is a miss
            return [None] * len(paths)
        objs: list[Optional[MemoryObj]] = []
        for info in infos:
            if isinstance(info, OSError) or META_XATTR not in info.xattrs:
                objs.append(None)
                continue
            meta = json.loads(info.xattrs[META_XATTR])
            objs.append(
                self.local_cpu_backend.allocate(
                    torch.Size(meta["shape"]), _DTYPES[meta["dtype"]], MemoryFormat[meta["fmt"]]
                )
            )
        return objs

    def batched_get_blocking(self, keys: List[CacheEngineKey]) -> List[Optional[MemoryObj]]:
        """Load chunks in one kvfs.client.direct batch (their attributes, then their bytes:
        three requests to the daemon for all of them); a chunk kvfs cannot give (gone,
        ENOENT at its lease: a namespace failed for reads; EIO) is a miss (None), which
        LMCache computes again."""
        paths = [self._file(k) for k in keys]
        objs = self._allocate(paths)
        todo = [i for i, o in enumerate(objs) if o is not None]
        try:
            got = self.direct.read_many(
                [paths[i] for i in todo],
                [objs[i].byte_array for i in todo],
                abandon=True,
                return_exceptions=True,
            )
        except ReadTimeout as e:
            # a namespace had no answer within the read deadline: every chunk of the call is
            # a miss (LMCache recomputes it) rather than a wait; the reads still in flight
            # land in these objects, which go back to LMCache's allocator once they end
            held = [objs[i] for i in todo]
            e.on_end(lambda: [o.ref_count_down() for o in held])
            return [None] * len(keys)
        except OSError as e:  # the daemon could not be asked: every chunk is a miss
            got = [e] * len(todo)
        for i, size in zip(todo, got):
            if isinstance(size, Exception):
                objs[i].ref_count_down()
                objs[i] = None
        return objs

    def get_blocking(self, key: CacheEngineKey) -> Optional[MemoryObj]:
        return self.batched_get_blocking([key])[0]

    def get_non_blocking(self, key: CacheEngineKey, location: Optional[str] = None):
        return self._writers.submit(self.get_blocking, key)

    async def batched_get_non_blocking(
        self, lookup_id: str, keys: list[CacheEngineKey], transfer_spec: Any = None
    ) -> list[MemoryObj]:
        loop = asyncio.get_running_loop()
        objs = await loop.run_in_executor(None, self.batched_get_blocking, keys)
        out = []
        for o in objs:  # a prefix: stop at the first chunk missing
            if o is None:
                break
            out.append(o)
        return out

    # --- the rest of the interface -------------------------------------------------------------
    def pin(self, key: CacheEngineKey) -> bool:
        return self.contains(key)  # kvfs never evicts an open or pinned chunk mid-read

    def unpin(self, key: CacheEngineKey) -> bool:
        return self.contains(key)

    def remove(self, key: CacheEngineKey, force: bool = True) -> bool:
        try:
            os.unlink(self._file(key))
            return True
        except FileNotFoundError:
            return False

    def get_allocator_backend(self):
        return self.local_cpu_backend

    def close(self) -> None:
        self._writers.shutdown(wait=True)
        self.direct.close()
