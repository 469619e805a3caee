"""Writes versioned files into a kvfs mount until it dies. Used by test_crash.py; run as a
separate process.

After each version's close() (or rename) returned it logs `name version kind time cycle`:
kind "fsync" when the version was made durable by fsync (of the file; for a tmp file renamed
into place, also of the directory, as POSIX asks), "close" when it was only closed (durable at
close in kvfs's "close" mode; within the write-back window in "fsync" mode)."""

import hashlib
import os
import random
import sys
import time


def content(name: str, version: int) -> bytes:
    """Deterministic bytes for (name, version), with a header that names them."""
    seed = int.from_bytes(hashlib.sha256(f"{name}/{version}".encode()).digest()[:8], "little")
    rng = random.Random(seed)
    size = rng.choice([0, 1, 4095, 4096, 70_000, 1 << 20, 3 * (1 << 20) + 17])
    header = f"{name}|{version}|{size}|".encode()
    return header + rng.randbytes(size)


def parse(data: bytes) -> tuple[str, int]:
    name, version, _size, _ = data.split(b"|", 3)
    return name.decode(), int(version)


def read_log(path) -> list[tuple[str, int, str, float, int]]:
    """(name, version, kind, time, cycle) per logged version (a line cut by a crash skipped)."""
    out = []
    if os.path.exists(path):
        with open(path) as log:
            for line in log:
                f = line.split()
                if len(f) == 5:
                    out.append((f[0], int(f[1]), f[2], float(f[3]), int(f[4])))
    return out


def main() -> None:
    mnt, log_path, cycle = sys.argv[1], sys.argv[2], int(sys.argv[3])
    # Every path is resolved against a descriptor of the mount's root: once the daemon is
    # killed and the mount cleared, calls fail instead of landing in the bare directory.
    root = os.open(mnt, os.O_RDONLY | os.O_DIRECTORY)
    rng = random.Random(cycle)
    versions: dict[str, int] = {}
    for n, v, *_ in read_log(log_path):
        versions[n] = max(versions.get(n, 0), v)
    # ... and what the mount holds: a version can be durable without its line in the log (its
    # fsync returned, then the close or the directory's fsync failed as the daemon was
    # killed); a later version numbered below it would look like a lost one
    for entry in os.listdir(root):
        if ".tmp" in entry:
            continue
        with open(os.open(entry, os.O_RDONLY, dir_fd=root), "rb") as f:
            n, v = parse(f.read(128))
        versions[n] = max(versions.get(n, 0), v)
    log = open(log_path, "a")
    i = 0
    while True:
        i += 1
        name = f"f{rng.randrange(40)}"
        version = versions.get(name, 0) + 1 + rng.randrange(3)
        data = content(name, version)
        flags = os.O_CREAT | os.O_TRUNC | os.O_WRONLY
        sync = rng.random() < 0.4
        if rng.random() < 0.3:  # tmp + rename, like LMCache's fs connector
            tmp = name + f".tmp{i}"
            fd = os.open(tmp, flags, 0o644, dir_fd=root)
            with open(fd, "wb") as f:
                f.write(data)
                if sync:
                    f.flush()
                    os.fsync(f.fileno())
            os.replace(tmp, name, src_dir_fd=root, dst_dir_fd=root)
            if sync:
                os.fsync(root)  # the rename made durable (fsyncdir)
        else:
            fd = os.open(name, flags, 0o644, dir_fd=root)
            with open(fd, "wb") as f:
                for off in range(0, len(data), 256 * 1024):
                    f.write(data[off : off + 256 * 1024])
                if sync:
                    f.flush()
                    os.fsync(f.fileno())
        versions[name] = version
        log.write(f"{name} {version} {'fsync' if sync else 'close'} {time.time():.6f} {cycle}\n")
        log.flush()
        os.fsync(log.fileno())


if __name__ == "__main__":
    main()
