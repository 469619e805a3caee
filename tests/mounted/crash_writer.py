"""Writes versioned files into a kvfs mount until it dies; logs each (name, version) after its
close() (or rename) returned. Used by test_crash.py; run as a separate process."""

import hashlib
import os
import random
import sys


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


def main() -> None:
    mnt, log_path, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
    # Every path is resolved against a descriptor of the mount's root: once the daemon is
    # killed and the mount cleared, calls fail instead of landing in the bare directory.
    root = os.open(mnt, os.O_RDONLY | os.O_DIRECTORY)
    rng = random.Random(seed)
    log = open(log_path, "a")
    versions: dict[str, int] = {}
    for line in open(log_path):
        n, v = line.split()
        versions[n] = max(versions.get(n, 0), int(v))
    i = 0
    while True:
        i += 1
        name = f"f{rng.randrange(40)}"
        version = versions.get(name, 0) + 1 + rng.randrange(3)
        data = content(name, version)
        flags = os.O_CREAT | os.O_TRUNC | os.O_WRONLY
        if rng.random() < 0.3:           # tmp + rename, like LMCache's fs connector
            tmp = name + f".tmp{i}"
            fd = os.open(tmp, flags, 0o644, dir_fd=root)
            with open(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, name, src_dir_fd=root, dst_dir_fd=root)
        else:
            fd = os.open(name, flags, 0o644, dir_fd=root)
            with open(fd, "wb") as f:
                for off in range(0, len(data), 256 * 1024):
                    f.write(data[off:off + 256 * 1024])
        versions[name] = version
        log.write(f"{name} {version}\n")
        log.flush()
        os.fsync(log.fileno())


if __name__ == "__main__":
    main()
