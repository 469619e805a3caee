"""kvfs doctor's findings from the statistics and from a config (no mount needed)."""

from __future__ import annotations

import contextlib
import io

from kvfs.cli import main as kvfs_main
from kvfs.cli.doctor import check_catalog, check_config, check_namespace_speed
from tests.helpers import write_config


def test_a_namespace_much_slower_than_the_others_is_named():
    nss = [
        {"index": i, "path": f"/dev/ns{i}", "rate_bps": r}
        for i, r in enumerate([100e6, 110e6, 95e6, 9e6, 0.0])
    ]
    found = check_namespace_speed("/mnt", nss)
    assert len(found) == 1 and found[0].status == "warn" and "namespace 3" in found[0].detail
    assert check_namespace_speed("/mnt", nss[:3]) == []
    assert check_namespace_speed("/mnt", nss[3:]) == []  # one measured: no median


def test_catalog_findings():
    assert check_catalog("/mnt", {"error": None, "opened_with": None}) == []
    (fail,) = check_catalog("/mnt", {"error": "catalog x: a write failed (disk full)"})
    assert fail.status == "fail" and "disk full" in fail.detail and "remount" in fail.fix
    (warn,) = check_catalog("/mnt", {"opened_with": "its write-ahead log ... partial frame"})
    assert warn.status == "warn" and "partial frame" in warn.detail


def test_check_config_names_a_torn_superblock_and_a_missing_namespace(tmp_path):
    nss = [{"path": str(tmp_path / f"ns{i}.img"), "size": "8MiB"} for i in range(2)]
    cfg = write_config(tmp_path / "k.toml", tmp_path / "state", nss)
    with contextlib.redirect_stdout(io.StringIO()):
        assert kvfs_main(["format", "--config", str(cfg)]) == 0
    ok = check_config(str(cfg))
    assert [f.status for f in ok if "namespace" in f.detail] == ["ok", "ok"], ok
    raw = (tmp_path / "ns1.img").read_bytes()[:4096]
    with open(tmp_path / "ns1.img", "r+b") as f:  # torn in its payload
        f.seek(raw.index(b'"size"'))
        f.write(b"XXXXXX")
    bad = [f for f in check_config(str(cfg)) if f.status == "fail"]
    assert len(bad) == 1 and "ns1.img" in bad[0].detail and "checksum" in bad[0].detail
    (tmp_path / "ns0.img").unlink()
    missing = [f for f in check_config(str(cfg)) if "ns0.img" in f.detail]
    assert missing and "does not exist" in missing[0].detail and missing[0].status == "fail"
