"""The profile store and the phase recorder (controller/profiles.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.clock import FakeClock

from burstctl.controller.jobs import JobTable
from burstctl.controller.profiles import (
    PROFILES_FILE,
    AppProfile,
    PhaseRecorder,
    ProfileStore,
    app_name,
)
from burstctl.controller.records import Counters, JobMeta, OpKind


def test_app_name_is_the_registered_app_else_the_job_id_prefix() -> None:
    assert app_name("1234_7") == "1234"
    assert app_name("1234.0") == "1234"
    assert app_name("wrf-run-3") == "wrf"
    assert app_name("plain") == "plain"
    assert app_name("1234_7", "wrf") == "wrf"


def test_profile_means_and_bandwidth_per_count() -> None:
    p = AppProfile()
    p.observe(volume=100.0, seconds=2.0, gap=None, count=2)
    p.observe(volume=300.0, seconds=2.0, gap=10.0, count=2)
    p.observe(volume=200.0, seconds=1.0, gap=20.0, count=4)
    assert p.phases == 3
    assert p.volume_per_phase == pytest.approx(200.0)
    assert p.gaps == 2
    assert p.compute_seconds == pytest.approx(15.0)
    # EWMA with alpha 0.5 at n = 2: 50 then 150 -> 100; one sample at n = 4
    assert p.bandwidth == {2: pytest.approx(100.0), 4: pytest.approx(200.0)}


def test_store_is_bounded_least_recently_updated_out() -> None:
    store = ProfileStore(None, max_keys=2)
    store.observe(("a", 1), 1.0, 1.0, None, 1)
    store.observe(("b", 1), 1.0, 1.0, None, 1)
    store.observe(("a", 1), 1.0, 1.0, None, 1)  # a is now the most recent
    store.observe(("c", 1), 1.0, 1.0, None, 1)
    assert store.keys() == [("a", 1), ("c", 1)]
    assert len(store) == 2


def test_store_survives_a_restart_and_writes_whole_files(tmp_path: Path) -> None:
    store = ProfileStore(tmp_path)
    store.observe(("wrf", 16), 1e9, 2.0, None, 2)
    store.observe(("wrf", 16), 3e9, 2.0, 30.0, 4)
    store.save()
    assert store.saved_version == store.version
    assert [p.name for p in tmp_path.iterdir()] == [PROFILES_FILE]  # no temporary left
    again = ProfileStore(tmp_path)
    assert again.load() == 1
    p = again.get(("wrf", 16))
    assert p is not None
    assert p.volume_per_phase == pytest.approx(2e9)
    assert p.compute_seconds == pytest.approx(30.0)
    assert p.bandwidth == {2: pytest.approx(5e8), 4: pytest.approx(1.5e9)}


def test_an_unreadable_file_is_kept_aside_and_the_store_starts_empty(tmp_path: Path) -> None:
    for n, bad in enumerate(("{not json", '{"profiles": 3}', "[]"), start=1):
        (tmp_path / PROFILES_FILE).write_text(bad)
        assert ProfileStore(tmp_path).load() == 0
        assert not (tmp_path / PROFILES_FILE).exists()
        assert (tmp_path / f"{PROFILES_FILE}.unreadable-{n}").read_text() == bad


def test_a_bad_entry_is_skipped_and_the_others_kept(tmp_path: Path) -> None:
    good = {"app": "wrf", "nodes": 2, "volume_per_phase": 5.0, "phases": 1}
    bad = {"app": "x", "nodes": 1, "volume_per_phase": "nan?"}
    (tmp_path / PROFILES_FILE).write_text(json.dumps({"profiles": [bad, good]}))
    store = ProfileStore(tmp_path)
    assert store.load() == 1
    assert store.keys() == [("wrf", 2)]
    assert (tmp_path / PROFILES_FILE).exists()  # readable: nothing kept aside


def test_recorder_measures_phases_of_the_job_table() -> None:
    clock = FakeClock()
    table = JobTable(clock, heartbeat_timeout=5.0, job_retention=60.0, demand_headroom=1.1)
    store = ProfileStore(None)
    counts = {"j1": 2}
    PhaseRecorder(store, table, count_of=lambda job_id: counts.get(job_id, 1))
    s = table.open_session(JobMeta("j1", "u", "g", 4, 1.0, app="ior"), "c1", "h")
    total = 0
    for phase in range(2):
        table.post(s, phase + 1, OpKind.WRITE, 0)
        clock.now += 2.0
        total += 1000
        table.usage(s, 1000, 1, 0.0, 2.0, False, totals=Counters(bytes=total, ops=1))
        table.complete(s, phase + 1)
        clock.now += 10.0  # compute
    p = store.get(("ior", 4))
    assert p is not None
    assert p.phases == 2
    # 1000 bytes here, two replicas striped evenly: 2000 bytes per phase, in 2 s
    assert p.volume_per_phase == pytest.approx(2000.0)
    assert p.compute_seconds == pytest.approx(10.0)
    assert p.bandwidth == {2: pytest.approx(1000.0)}
