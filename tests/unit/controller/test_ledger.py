"""The ledger keeps jobs' counters across restarts; a bad file never stops a replica."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from support.clock import FakeClock

from burstctl.controller.jobs import JobTable
from burstctl.controller.ledger import LEDGER_FILE, Ledger
from burstctl.controller.records import Counters, JobMeta


def table(clock: FakeClock | None = None, retention: float = 300) -> JobTable:
    return JobTable(
        clock or FakeClock(0.0), heartbeat_timeout=3, job_retention=retention, demand_headroom=1.1
    )


def test_saved_counters_are_carried_into_the_returning_job(tmp_path: Path) -> None:
    before = table()
    s = before.open_session(JobMeta("j", "u", "g", 1, 1.0), "c1", "h")
    before.usage(s, 10, 2, 0.5, 0.25, False, Counters(10, 4, 6, 2, 1, 0.5))
    ledger = Ledger(tmp_path, before)
    ledger.write(ledger.snapshot())

    after = table()
    reloaded = Ledger(tmp_path, after)  # it carries the saved counters into new jobs
    assert reloaded.load() == 1
    s2 = after.open_session(JobMeta("j", "u", "g", 1, 1.0), "c1", "h")
    # the same session reconnects with totals that include 6 bytes the old run never booked
    after.usage(s2, 6, 1, 0.0, 0.25, False, Counters(16, 4, 12, 3, 1, 0.5))
    assert after.jobs["j"].counters == Counters(16, 4, 12, 3, 1, 0.5)


def test_an_unreadable_ledger_is_kept_aside_and_counters_start_at_zero(tmp_path: Path) -> None:
    bad = '{"format": 1, "jobs": {"j": {"counters": {"bytes": -1}}}}'
    (tmp_path / LEDGER_FILE).write_text(bad)
    (tmp_path / (LEDGER_FILE + ".unreadable-1")).write_text("an older one")
    ledger = Ledger(tmp_path, table())
    assert ledger.load() == 0
    assert not (tmp_path / LEDGER_FILE).exists()
    assert (tmp_path / (LEDGER_FILE + ".unreadable-2")).read_text() == bad
    assert (tmp_path / (LEDGER_FILE + ".unreadable-1")).read_text() == "an older one"


def test_carried_counters_of_jobs_that_never_return_expire(tmp_path: Path) -> None:
    t = table(retention=10)
    s = t.open_session(JobMeta("gone", "u", "g", 1, 1.0), "c", "h")
    t.usage(s, 5, 1, 0.0, 0.25, False, Counters(5, 5, 0, 1, 0, 0.0))
    first = Ledger(tmp_path, t)
    first.write(first.snapshot())
    clock = FakeClock(0.0)
    ledger = Ledger(tmp_path, table(clock, retention=10))
    assert ledger.load() == 1
    assert "gone" in ledger.snapshot()["carried"]
    clock.now = 11.0  # past the table's job_retention
    assert ledger.snapshot()["carried"] == {}


def test_a_returned_job_stays_in_the_ledger_until_it_moves_again(tmp_path: Path) -> None:
    before = table()
    s = before.open_session(JobMeta("j", "u", "g", 1, 1.0), "c1", "h")
    before.usage(s, 10, 1, 0.0, 0.25, False, Counters(10, 10, 0, 1, 0, 0.0))
    first = Ledger(tmp_path, before)
    first.write(first.snapshot())
    after = table()
    ledger = Ledger(tmp_path, after)
    ledger.load()
    after.open_session(JobMeta("j", "u", "g", 1, 1.0), "c2", "h")  # back, idle so far
    ledger.write(ledger.snapshot())
    again = Ledger(tmp_path, table())
    assert again.load() == 1
    assert again.carried["j"][0] == Counters(10, 10, 0, 1, 0, 0.0)


def test_a_snapshot_reads_only_the_jobs_that_moved(tmp_path: Path) -> None:
    t = table()
    idle = [t.open_session(JobMeta(f"idle{i}", "u", "g", 1, 1.0), "c", "h") for i in range(100)]
    busy = t.open_session(JobMeta("busy", "u", "g", 1, 1.0), "c", "h")
    ledger = Ledger(tmp_path, t)
    assert ledger.snapshot()["entries"] == {}
    t.usage(busy, 5, 1, 0.0, 0.25, False, Counters(5, 0, 5, 1, 0, 0.0))
    assert t.counted == {"busy"}
    assert set(ledger.snapshot()["entries"]) == {"busy"}
    assert t.counted == set()
    assert len(idle) == 100


def test_a_session_that_said_goodbye_leaves_no_booked_totals() -> None:
    # Without this a job reused by many short sessions kept one entry per session: the soak
    # (155,000 sessions over 1,000 jobs) doubled the controller's RSS in 10 minutes.
    t = table()
    for i in range(300):
        s = t.open_session(JobMeta("j", "u", "g", 1, 1.0), f"c{i}", "h")
        t.usage(s, 5, 1, 0.0, 0.25, False, Counters(5, 5, 0, 1, 0, 0.0))
        t.goodbye(s)
        t.close_session(s)
    job = t.jobs["j"]
    assert job.booked == {}
    assert job.counters == Counters(1500, 1500, 0, 300, 0, 0.0)


def test_a_report_that_moved_nothing_leaves_the_ledger_alone() -> None:
    # Otherwise every heartbeat of any live session rewrote (and fsynced) ledger.json.
    t = table()
    s = t.open_session(JobMeta("j", "u", "g", 1, 1.0), "c", "h")
    t.usage(s, 5, 1, 0.0, 0.25, False, Counters(5, 5, 0, 1, 0, 0.0))
    version = t.counters_version
    t.counted.clear()
    t.usage(s, 0, 0, 0.0, 0.25, False, Counters(5, 5, 0, 1, 0, 0.0))  # the same totals
    assert (t.counters_version, t.counted) == (version, set())
    t.usage(s, 3, 1, 0.0, 0.25, False, Counters(8, 5, 3, 2, 0, 0.0))
    assert t.counters_version > version and t.counted == {"j"}


def test_counters_as_dict_names_every_field_as_asdict_does() -> None:
    c = Counters(1, 2, 3, 4, 5, 6.5)
    assert c.as_dict() == dataclasses.asdict(c)
    assert list(c.as_dict()) == [f.name for f in dataclasses.fields(Counters)]


def test_the_drained_bytes_continue_after_a_restart(tmp_path: Path) -> None:
    before = table()
    meta = JobMeta("j", "u", "g", 1, 1.0)
    drain = before.open_session(meta, "d1", "h", drain=True)
    before.usage(drain, 100, 1, 0.0, 0.25, False, Counters(bytes=100))
    assert before.jobs["j"].drained == before.drained_total == 100
    ledger = Ledger(tmp_path, before)
    ledger.write(ledger.snapshot())

    after = table()
    reloaded = Ledger(tmp_path, after)
    assert reloaded.load() == 1
    assert after.drained_total == 100  # /metrics' burstctl_drained_bytes_total goes on
    drain2 = after.open_session(meta, "d1", "h", drain=True)
    # The same drain client reconnects: its totals include 20 bytes the old run never booked.
    after.usage(drain2, 20, 1, 0.0, 0.25, False, Counters(bytes=120))
    assert after.jobs["j"].drained == after.drained_total == 120
    assert after.jobs["j"].counters == Counters()  # never the job's own I/O
    ledger2 = Ledger(tmp_path, after)
    ledger2.write(ledger2.snapshot())
    again = table()
    assert Ledger(tmp_path, again).load() == 1
    assert again.drained_total == 120


def test_a_drained_report_marks_the_job_for_the_ledger() -> None:
    t = table()
    drain = t.open_session(JobMeta("j", "u", "g", 1, 1.0), "d", "h", drain=True)
    version = t.counters_version
    t.usage(drain, 0, 0, 0.0, 0.25, False, Counters())  # an idle heartbeat
    assert t.counters_version == version
    t.usage(drain, 5, 1, 0.0, 0.25, False, Counters(bytes=5))
    assert t.counters_version > version and "j" in t.counted
