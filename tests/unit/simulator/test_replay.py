"""The Darshan replay's mapping (simulator/replay/): what it reads from a log, checked against
PyDarshan's own report of the same log, and the phases it makes, checked by hand."""

from __future__ import annotations

import importlib.resources
from pathlib import Path

import pytest

from burstctl.simulator.bws.runs import simulate_yields
from burstctl.simulator.replay.darshan import DarshanLog, LogError, Transfer, read_log
from burstctl.simulator.replay.mapping import bin_volumes, replay_jobs

darshan = pytest.importorskip("darshan", reason="PyDarshan is the sim extra's")
from darshan.backend.cffi_backend import accumulate_records  # noqa: E402

INPUT = Path(str(importlib.resources.files("darshan") / "tests" / "input"))


def _report(name: str, module: str) -> tuple[object, object]:
    """PyDarshan's own records of ``module`` in log ``name`` (pandas), and its accumulated
    summary (the derived metrics darshan-job-summary prints)."""
    with darshan.DarshanReport(str(INPUT / name), read_all=False) as report:
        report.mod_read_all_records(module, dtype="pandas")
        records = report.records[module][0]
        return records, accumulate_records(records, module, report.metadata["job"]["nprocs"])


def test_counters_are_the_records_pydarshan_reports() -> None:
    log = read_log(INPUT / "sample-goodost.darshan")
    records, summary = _report("sample-goodost.darshan", "POSIX")
    c, f = records["counters"], records["fcounters"]
    theirs = sorted(
        (start, end, int(nbytes), int(rank))
        for start, end, nbytes, rank in zip(
            f["POSIX_F_WRITE_START_TIMESTAMP"],
            f["POSIX_F_WRITE_END_TIMESTAMP"],
            c["POSIX_BYTES_WRITTEN"],
            c["rank"],
            strict=True,
        )
        if nbytes > 0
    )
    ours = sorted((t.start, t.end, t.nbytes, t.rank) for t in log.transfers)
    assert ours == theirs and len(ours) == 48
    assert all(t.kind == "write" and t.module == "POSIX" for t in log.transfers)
    # the job's bytes are PyDarshan's derived total (its STDIO output is <STDOUT>: left out)
    assert log.nbytes == summary.derived_metrics.total_bytes == 48 << 30
    assert (log.nprocs, log.run_time) == (48, 5.0)


def test_dxt_segments_stand_for_their_files_counters() -> None:
    log = read_log(INPUT / "sample-dxt-simple.darshan")
    with darshan.DarshanReport(str(INPUT / "sample-dxt-simple.darshan"), read_all=False) as r:
        r.mod_read_all_dxt_records("DXT_POSIX", dtype="dict")
        segments = sorted(
            (seg["start_time"], seg["end_time"], seg["length"], rec["id"])
            for rec in r.records["DXT_POSIX"]
            for seg in rec["write_segments"]
        )
    assert log.dxt
    assert sorted((t.start, t.end, t.nbytes, t.file) for t in log.transfers) == segments
    # the MPI-IO record of the same file (4000 bytes) lands in POSIX: counted once
    assert log.nbytes == 4040


def test_mpiio_over_posix_and_the_standard_streams_count_once() -> None:
    log = read_log(INPUT / "sample.darshan")
    posix, _ = _report("sample.darshan", "POSIX")
    assert [t.module for t in log.transfers] == ["POSIX"]
    assert log.nbytes == int(posix["counters"]["POSIX_BYTES_WRITTEN"].sum())


def test_the_window_keeps_every_byte_and_the_logs_timeline() -> None:
    log = read_log(INPUT / "sample-goodost.darshan")
    width, volumes = bin_volumes(log, 50)
    assert width == pytest.approx(0.1) and sum(volumes) == pytest.approx(log.nbytes, rel=1e-12)
    replay = replay_jobs([log], bins=50)
    io = sum(p.value for p in replay.window.apps[0].phases if p.io)
    assert io * replay.bandwidth == pytest.approx(log.nbytes, rel=1e-9)
    # default B and b: the cap covers the peak bin, so the dedicated run is the log's own
    assert replay.window.horizon == pytest.approx(log.run_time)
    assert replay.apps[0].bandwidth == pytest.approx(replay.bandwidth)


def _synthetic(name: str = "toy", run_time: float = 10.0) -> DarshanLog:
    return DarshanLog(
        path=f"/logs/{name}.darshan",
        job_id=1,
        nprocs=1,
        run_time=run_time,
        transfers=(
            Transfer(1.0, 3.0, 200, "write", "POSIX", 0, 7),
            Transfer(7.5, 7.5, 50, "read", "POSIX", 0, 8),
        ),
        dxt=False,
    )


def test_bins_become_io_and_work_phases() -> None:
    replay = replay_jobs([_synthetic()], bins=10, bandwidth=100.0, node_bandwidth=100.0)
    app = replay.apps[0]
    # work to the first bin with bytes, the two I/O bins merged, work, I/O, work to the end
    assert (app.initial_type, app.values) == ("W", (1.0, 200.0, 4.0, 50.0, 2.5))
    assert replay.window.horizon == pytest.approx(10.0)


def test_jobs_are_staggered_and_padded_to_the_longest() -> None:
    logs = [_synthetic(), _synthetic(), _synthetic("short", run_time=5.0)]
    replay = replay_jobs(logs, bins=10, bandwidth=100.0, node_bandwidth=100.0, stagger=1.0)
    assert [j.name for j in replay.jobs] == ["toy", "toy#2", "short"]
    # toy#2 starts after 1 s and ends last, at T = 11; toy is padded with 1 s of work
    assert replay.apps[1].values == (2.0, 200.0, 4.0, 50.0, 2.5)
    assert replay.apps[0].values == (1.0, 200.0, 4.0, 50.0, 3.5)
    # short: bins of 0.5 s from t = 2; the 50 bytes at 7.5 s, past its end, in its last bin
    assert replay.apps[2].values == (3.0, 200.0, 1.5, 50.0, 4.0)
    assert replay.window.horizon == pytest.approx(11.0)


def test_yields_of_two_copies_match_the_hand_computed_ones() -> None:
    replay = replay_jobs([_synthetic()] * 2, bins=10, bandwidth=100.0, node_bandwidth=100.0)
    # fair-share: both move their 200 bytes at 50 B/s over [1, 5], work to 9, then 50 bytes
    # each at 50 B/s until T = 10: P = 1 + 2 + 4 + 0.5 = 7.5 of 10
    _, yields = simulate_yields(replay.window, "fair-share")
    assert yields == pytest.approx((0.75, 0.75))
    # fcfs: the first runs as if alone; the second moves over [3, 5], works to 9, moves at
    # 9 and works 0.5 of its last 2.5 s: P = 8
    _, yields = simulate_yields(replay.window, "fcfs")
    assert yields == pytest.approx((1.0, 0.8))


def test_every_prefix_of_a_log_is_an_error_naming_it_never_a_crash(tmp_path: Path) -> None:
    """libdarshan-util trusts a log's own offsets: on some truncations it crashed the reading
    process. Each log is read in a child, so a cut log is this log's error, whatever the cut."""
    whole = (INPUT / "sample.darshan").read_bytes()
    cut = tmp_path / "cut.darshan"
    for size in range(0, len(whole), 500):
        cut.write_bytes(whole[:size])
        with pytest.raises(LogError, match=f"^{cut}: "):
            read_log(cut)
    cut.write_bytes(whole)
    assert read_log(cut).nbytes == read_log(INPUT / "sample.darshan").nbytes > 0
