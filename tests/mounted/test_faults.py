"""Faults injected into kvfs (bench/faults.py runs them and reports; here each report is
checked): the errno the client gets, one log line naming the problem, the blocks the fault
does not touch unharmed, the daemon still serving, `kvfs doctor` naming the problem (on the
mount, or with --config while it cannot start), and a remount recovering."""

from __future__ import annotations

import pytest

from bench import faults
from tests.helpers import requires_loops, requires_throttle

pytestmark = pytest.mark.slow


def run(name: str, tmp_path) -> dict:
    return faults.SCENARIOS[name](tmp_path)


def named(findings: list[str], *needles: str) -> list[str]:
    return [f for f in findings if all(n in f for n in needles)]


@requires_throttle          # (slowed down, so that the device ends while I/O is in flight)
@pytest.mark.parametrize("name", ["shrink_mid_write", "shrink_mid_read"])
def test_a_namespace_that_ends_mid_io(tmp_path, name):
    r = run(name, tmp_path)
    assert r["in_flight_when_shrunk"], r
    assert r["client_errno"] == "EIO", r
    assert len(r["log"]) == 1 and "namespace 1" in r["log"][0], r["log"]
    assert r["others_ok"], r["small_files"]           # files without units there read back
    assert r["affected_fail_with"] in ([], ["EIO"]), r["small_files"]
    # namespace 1 is failed, unless an I/O on it succeeded since (and verified its checksums):
    # the emulated device answers again past its new end when a queued write re-extends it
    assert r["namespace_states"] in (["ok", "failed", "ok"], ["ok", "ok", "ok"]), r
    assert r["namespace_states"][1] == "failed" or r["log_ok_again"], r
    assert r["serving"]
    assert named(r["doctor"], "FAIL namespace", "namespace 1"), r["doctor"]
    assert r["recovered"], r["after_remount"]


@requires_loops
def test_a_detached_namespace(tmp_path):
    r = run("detached", tmp_path)
    assert r["read_while_mounted"] is None and r["serving"]   # the kernel defers the detach
    assert r["remount_status"] == 1
    assert "\n" not in r["remount_error"] and "is it attached?" in r["remount_error"]
    assert named(r["doctor"], "FAIL config", "namespace 1", "is it attached?"), r["doctor"]
    assert r["recovered"]


def test_writers_racing_eviction_on_a_small_pool(tmp_path):
    r = run("enospc_lru", tmp_path)
    assert r["client_errnos"] == {} and r["closed_ok"] == r["writes"], r
    assert r["evictions"] > 0 and r["reserved_after"] == 0
    assert r["used_after"] <= r["capacity"]
    assert r["failed_present"] == [] and r["reads_of_present"] == {"ok": r["present"]}
    assert not r["traceback"] and r["serving"] and r["recovered"]


def test_writers_racing_for_a_full_pool_that_never_evicts(tmp_path):
    r = run("enospc_never", tmp_path)
    assert set(r["client_errnos"]) == {"ENOSPC"} and r["closed_ok"] > 0, r
    assert r["closed_ok"] + r["client_errnos"]["ENOSPC"] == r["writes"]
    assert r["reserved_after"] == 0 and r["evictions"] == 0
    # what closed reads back bit-exact; a new file whose write or commit failed is gone
    assert r["failed_present"] == [], r["failed_present"]
    assert r["reads_of_present"] == {"ok": r["present"]}
    assert r["log"] and all("pool is full" in ln for ln in r["log"])
    assert not r["traceback"] and r["serving"] and r["recovered"]


def test_a_full_state_dir_disk(tmp_path):
    r = run("state_dir_full", tmp_path)
    assert r["client_errno"] == "EIO" and r["mkdir_errno"] == "EIO", r
    assert r["new_file_reads"] == "ENOENT"                           # nothing half-made
    # a mkdir is applied, then made durable (at once with "close": undone when that fails;
    # with "fsync" at the fsync, which fails: gone after the restart, below)
    assert not r["dir_exists"] or r["durability"] == "fsync"
    assert len(r["log"]) == 1 and "database or disk is full" in r["log"][0], r["log"]
    assert r["others_ok"] and r["serving_reads"]
    assert "disk is full" in r["catalog_error"]
    assert named(r["doctor"], "FAIL catalog", "disk is full"), r["doctor"]
    assert r["after_remount"]["files"] == ["b0", "b1", "b2"]        # the failed ones are absent
    assert r["recovered"]


@requires_throttle
def test_a_slow_namespace(tmp_path):
    r = run("slow_namespace", tmp_path)
    assert r["client_errnos"] == [] and r["bad_reads"] == [], r
    assert r["served_during_slow_read"] == 5 and not r["slow_read_finished_first"]
    w = r["placement_weights"]
    assert w[3] < 0.5 * min(w[:3]), w                               # placement learns it
    assert r["namespace_states"] == ["ok"] * 4
    assert named(r["doctor"], "WARN namespace", "namespace 3", "is slow"), r["doctor"]
    assert not named(r["doctor_after_remount"], "is slow")          # unthrottled, remounted
    assert r["serving"] and r["recovered"]


def test_a_torn_superblock(tmp_path):
    r = run("torn_superblock", tmp_path)
    assert named(r["doctor_unmounted"], "FAIL config", "ns1.img", "checksum mismatch",
                 "next mount rebuilds it"), r["doctor_unmounted"]
    assert len(r["log"]) == 1 and "rebuilt" in r["log"][0], r["log"]
    assert r["data_ok"]
    assert named(r["doctor"], "WARN namespace", "ns1.img", "rebuilt"), r["doctor"]
    # torn where it names its pool: refused, one line; doctor says which namespace
    assert r["refused_status"] == 1 and "\n" not in r["refused_error"]
    assert "ns1.img" in r["refused_error"] and "cannot be rebuilt safely" in r["refused_error"]
    assert named(r["doctor_refused"], "FAIL config", "ns1.img"), r["doctor_refused"]
    assert r["recovered"] and r["serving"]


def test_a_truncated_catalog_log(tmp_path):
    r = run("truncated_wal", tmp_path)
    assert named(r["doctor_unmounted"], "WARN config", "partial frame"), r["doctor_unmounted"]
    assert len(r["log"]) == 1 and r["opened_with"], r["log"]
    assert r["files_lost"] and r["lost_errno"] == ["ENOENT"]        # the lost ones are absent
    assert r["kept_ok"] and r["space_of_lost_files_free"]
    assert named(r["doctor"], "WARN catalog", "partial frame"), r["doctor"]
    assert r["serving"] and r["recovered"]
