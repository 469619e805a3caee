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


@requires_throttle  # (slowed down, so that the device ends while I/O is in flight)
@pytest.mark.parametrize("name", ["shrink_mid_write", "shrink_mid_read"])
def test_a_namespace_that_ends_mid_io(tmp_path, name):
    r = run(name, tmp_path)
    assert r["in_flight_when_shrunk"], r
    if name == "shrink_mid_write":
        # the writer's fsync says what happened, in either durability mode: 0 where what
        # namespace 1 could not take was written to the others (or its I/O had been queued
        # before the device ended, and landed), and then the file is whole after a remount;
        # EIO where it could not be written anywhere, and then it is absent
        assert r["client_errno"] in (None, "EIO"), r
        want = [None] if r["client_errno"] is None else ["ENOENT"]
        assert [r["after_remount"]["big"]] == want, r
        assert len(r["log"]) <= 1 and all("namespace 1" in ln for ln in r["log"]), r["log"]
    else:
        # a cold open that cannot bring the block in: ENOENT (absent: an engine's miss) under
        # passthrough, where the open fetches it; EIO from the read without it
        assert r["client_errno"] in ("EIO", "ENOENT"), r
        assert len(r["log"]) == 1 and "namespace 1" in r["log"][0], r["log"]
    assert r["others_ok"], r["small_files"]  # files without units there read back
    assert r["affected_fail_with"] in ([], ["EIO"], ["ENOENT"]), r["small_files"]
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
    assert r["read_while_mounted"] is None and r["serving"]  # the kernel defers the detach
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
    assert r["new_file_reads"] == "ENOENT"  # nothing half-made
    # a mkdir is applied, then made durable (at once with "close": undone when that fails;
    # with "fsync" at the fsync, which fails: gone after the restart, below)
    assert not r["dir_exists"] or r["durability"] == "fsync"
    assert len(r["log"]) == 1 and "database or disk is full" in r["log"][0], r["log"]
    assert r["others_ok"] and r["serving_reads"]
    assert "disk is full" in r["catalog_error"]
    assert named(r["doctor"], "FAIL catalog", "disk is full"), r["doctor"]
    assert r["after_remount"]["files"] == ["b0", "b1", "b2"]  # the failed ones are absent
    assert r["recovered"]


@requires_throttle
def test_a_slow_namespace(tmp_path):
    r = run("slow_namespace", tmp_path)
    assert r["client_errnos"] == [] and r["bad_reads"] == [], r
    assert r["served_during_slow_read"] == 5 and not r["slow_read_finished_first"]
    assert r["slow_read"] is None, r  # (bit-exact, however slow: read_timeout_ms is 60 s)
    w = r["placement_weights"]
    assert w[3] < 0.5 * min(w[:3]), w  # placement learns it
    assert r["namespace_states"] == ["ok"] * 4
    assert named(r["doctor"], "WARN namespace", "namespace 3", "is slow"), r["doctor"]
    assert not named(r["doctor_after_remount"], "is slow")  # unthrottled, remounted
    assert r["serving"] and r["recovered"]


def test_a_torn_superblock(tmp_path):
    r = run("torn_superblock", tmp_path)
    assert named(
        r["doctor_unmounted"],
        "FAIL config",
        "ns1.img",
        "checksum mismatch",
        "next mount rebuilds it",
    ), r["doctor_unmounted"]
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
    assert r["files_lost"] and r["lost_errno"] == ["ENOENT"]  # the lost ones are absent
    assert r["kept_ok"] and r["space_of_lost_files_free"]
    assert named(r["doctor"], "WARN catalog", "partial frame"), r["doctor"]
    assert r["serving"] and r["recovered"]


def _no_lies(r: dict) -> None:
    """The targets every device fault must meet (issue 43), in both durability modes."""
    assert r["daemon_deaths"] == 0, r
    assert r["durable_lost"] == [], r
    assert r["wrong_reads"] == [], r
    assert r["fsync_ok_after_failed_writeback"] == 0, r["probes"]
    assert r["recovery_s"] is not None and r["recovery_s"] <= 10, r
    assert r["all_ok_s"] is not None and r["all_ok_s"] <= 10, r
    assert r["serving"]


@requires_loops
def test_a_namespace_whose_device_fills_is_written_around(tmp_path):
    """Namespace 1's backing tmpfs fills (its loop device fails writes with EIO), then heals:
    every fsync'd file lands on the other namespaces, nothing is lost or reported wrongly,
    and namespace 1 is used again within seconds of healing, without a remount."""
    r = run("fill_one", tmp_path)
    _no_lies(r)
    assert r["writes_failed"] == 0 and r["writes_durable"] == 16, r
    assert r["namespace_states_in_fault"][1] == "failed", r
    assert r["exit_status"] == 0


@requires_loops
def test_a_pool_whose_devices_all_fill_reports_every_failed_write_back(tmp_path):
    """Every namespace's backing tmpfs fills: writes cannot go anywhere. Each fsync says so;
    a file closed (not fsync'd) whose write-back then failed is reported by fsync, to a
    descriptor open across the failure and to a later opener (errseq), never 0 while the
    file holds its previous version; after healing, a new file is durable within seconds."""
    r = run("fill_all", tmp_path)
    _no_lies(r)
    assert r["writes_failed"] > 0 and r["writer_errnos"] == ["EIO"], r
    for p in r["probes"].values():
        assert p["reads_new"] or "EIO" in (p["close"], p["fsync"]), r["probes"]


@requires_throttle
def test_a_stalled_namespace_holds_no_call_past_its_deadline(tmp_path):
    """Namespace 1 throttled to 4 KiB/s for 12 s while writers fsync: its share of each
    write-back is given up at the I/O deadline (io_timeout_ms, 5 s) and written elsewhere, so
    no call waits the stall out."""
    r = run("stall", tmp_path)
    _no_lies(r)
    assert r["writes_failed"] == 0, r
    assert r["longest_call_s"] <= r["io_timeout_s"] + 2, r
    assert sum(r["timeouts"]) >= 1, r


def test_a_stop_right_after_close_loses_no_closed_file(tmp_path):
    """SIGTERM after close() returned but before the kernel's RELEASE (here: never, a
    duplicate descriptor stays open): the stop writes back what the close accepted."""
    r = run("stop_after_close", tmp_path)
    assert r["lost"] == [], r["reads"]
    assert r["exit_status"] == 0


@requires_throttle
def test_a_stalled_namespace_costs_a_reader_the_read_deadline_then_nothing(tmp_path):
    """Namespace 1 throttled to 4 KiB/s for 10 s while two readers load blocks cold: a load
    waits the read deadline (read_timeout_ms, 2 s) at most, and its open answers ENOENT (a
    miss); once the namespace is failed for reads every load of a block on it fails at once;
    blocks elsewhere load bit-exact throughout; healed, every block loads again without a
    remount."""
    r = run("stall_read", tmp_path)
    _read_fault_checks(r)
    assert r["read_states_in_fault"] == ["ok", "failed", "ok"], r
    assert named(r["doctor_in_fault"], "FAIL namespace", "namespace 1", "failed for reads")
    assert r["longest_open_s"] <= r["read_timeout_s"] + 0.5, r
    assert r["first_failure_s"] >= 1.0, r  # (it did wait: the deadline, not at once)


@requires_loops
def test_a_lost_namespace_costs_a_reader_nothing(tmp_path):
    """Namespace 1 ends at 1 MiB (I/O past it fails, as on a path that is gone) for 10 s
    while two readers load blocks cold: loads of blocks on it fail at once with ENOENT, the
    others load bit-exact; the path back, every block loads again."""
    r = run("lost_namespace", tmp_path)
    _read_fault_checks(r)
    assert r["longest_open_s"] <= 0.5, r


def _read_fault_checks(r: dict) -> None:
    assert r["daemon_deaths"] == 0 and r["exit_status"] == 0, r
    assert r["wrong_reads"] == [] and r["durable_lost"] == [], r
    assert r["others_failed"] == 0, r
    # an open that cannot bring its block in answers ENOENT (under passthrough; the read
    # EIO where the daemon serves reads)
    assert r["errnos"] in (["ENOENT"], ["EIO"], ["EIO", "ENOENT"]), r
    assert r["failed_loads_after_first"] >= 10, r
    assert r["fast_fail_ms"] <= 10, r
    assert r["longest_read_s"] <= r["read_timeout_s"] + 0.5, r
    assert r["recovery_s"] is not None and r["recovery_s"] <= 10, r
    assert r["serving"], r


@requires_loops
def test_a_namespace_gone_for_good_is_removed_while_readers_run(tmp_path):
    """Namespace 1 ends and stays gone: once reads there failed, `kvfs pool remove` (no
    --drop) takes it out while two readers load; its files are misses at the lookup from
    then on (ENOENT in well under 10 ms), the others load bit-exact throughout, new files
    avoid it, and a restart with its device detached loses nothing else."""
    r = run("remove_namespace", tmp_path)
    assert r["remove_status"] == 0 and r["dropped"] >= 1, r
    assert r["miss_errnos"] == ["ENOENT"] and r["miss_ms"] <= 10, r
    assert r["wrong_reads"] == [] and r["others_failed"] == 0 and r["new_on_removed"] == 0, r
    assert r["daemon_deaths"] == 0 and r["exit_status"] == 0, r
    assert r["durable_lost"] == [] and r["dropped_present"] == [], r
    assert r["states"] == ["ok", "removed", "ok"] and r["serving"], r
