"""What FUSE_HANDLE_KILLPRIV_V2 costs and saves (mount/fuse/pyfuse3-killpriv.patch): the
kernel asks for security.capability once per new file, not before every write, and kvfs keeps
no set-user-ID / set-group-ID bit on files, so it never has one to clear on a write the
daemon does not see (passthrough)."""

from __future__ import annotations

import errno
import os
import stat

import pytest

pytestmark = pytest.mark.mounted


def _getxattrs(m) -> int:
    """GETXATTRs of names outside user.* (the statistics' own reads are user.kvfs.stats)."""
    return m.stats()["latency"].get("getxattr_nonuser", {}).get("count", 0)


def test_the_kernel_asks_for_security_capability_once_per_file(mnt):
    assert mnt.stats()["data_path"]["killpriv_v2"], "FUSE_HANDLE_KILLPRIV_V2 not negotiated"
    p = mnt.mountpoint / "block"
    before = _getxattrs(mnt)
    fd = os.open(p, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    try:
        for i in range(4):
            os.write(fd, bytes([i]) * 65536)
    finally:
        os.close(fd)
    # stock: one before each write(2) (4); with SB_NOSEC the first finds nothing to clear
    assert _getxattrs(mnt) - before == 1
    fd = os.open(p, os.O_WRONLY | os.O_APPEND)  # the inode is still cached: no question
    try:
        os.write(fd, b"more")
    finally:
        os.close(fd)
    assert _getxattrs(mnt) - before == 1
    assert p.read_bytes() == b"".join(bytes([i]) * 65536 for i in range(4)) + b"more"


def test_names_outside_user_are_absent(mnt):
    p = mnt.mountpoint / "f"
    p.write_bytes(b"x")
    os.setxattr(p, "user.model", b"llama")
    for name in ("security.capability", "trusted.x", "system.posix_acl_access"):
        with pytest.raises(OSError) as e:
            os.getxattr(p, name)
        assert e.value.errno == errno.ENODATA, name
    assert os.getxattr(p, "user.model") == b"llama"  # still the handler's


def test_set_id_bits_refused_on_files_kept_on_directories(mnt):
    root = mnt.mountpoint
    f = root / "f"
    f.write_bytes(b"x")
    for bits in (stat.S_ISUID, stat.S_ISGID):
        with pytest.raises(PermissionError):
            os.chmod(f, 0o755 | bits)
        with pytest.raises(PermissionError):
            os.open(root / f"new{bits}", os.O_CREAT | os.O_WRONLY, 0o755 | bits)
        assert not (root / f"new{bits}").exists()
    assert stat.S_IMODE(os.stat(f).st_mode) == 0o644
    os.chmod(f, 0o600)  # other modes still change
    assert stat.S_IMODE(os.stat(f).st_mode) == 0o600
    d = root / "d"
    d.mkdir()
    os.chmod(d, 0o2775)  # a set-group-ID directory: its files take its group
    assert os.stat(d).st_mode & stat.S_ISGID
    os.chown(d, 0, 1234)
    (d / "g").write_bytes(b"y")
    st = os.stat(d / "g")
    assert st.st_gid == 1234 and not st.st_mode & stat.S_ISGID


def test_a_direct_writer_is_refused_set_id_bits_too(mnt):
    """kvfs.client.direct creates files without the mount: the same rule, per block."""
    from kvfs.client.direct import Direct

    root = mnt.mountpoint
    with Direct(str(root)) as d:
        out = d.write_many(
            [str(root / "plain"), str(root / "setuid")],
            [b"p" * 4096, b"s" * 4096],
            mode=0o4755,
            return_exceptions=True,
        )
        assert all(isinstance(e, PermissionError) for e in out), out
        assert d.write_many([str(root / "plain")], [b"p" * 4096], mode=0o755) == [None]
    assert not (root / "setuid").exists()
    assert stat.S_IMODE(os.stat(root / "plain").st_mode) == 0o755
