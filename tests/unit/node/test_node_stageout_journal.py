"""The stage-out's journal (`stageout_journal`) on real directories (no FUSE): replay, a torn
last record, compaction, the fallbacks to a scan of BACKING, and restarts of `StageOut` that
resume from it."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support import wait_until
from test_node_stageout import JOB, Hooks, key_of, write_through

from burstctl.node import stageout_journal
from burstctl.node.stageout import StageOut
from burstctl.node.stageout_journal import XATTR_JOURNAL, Journal
from burstctl.node.stageout_marks import encode_job

TAG = encode_job(JOB)


@pytest.fixture
def backing(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    path = tmp_path / "backing"
    path.mkdir()
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    yield path, fd
    os.close(fd)


@pytest.fixture
def boot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A boot id file of our own: a test "reboots" by changing it."""
    path = tmp_path / "boot_id"
    path.write_text("boot-1\n")
    monkeypatch.setattr(stageout_journal, "BOOT_ID", str(path))
    return path


@pytest.fixture
def opened(tmp_path: Path, backing: tuple[Path, int], boot: Path) -> Callable[[], Journal]:
    """Opens the journal ``tmp_path/j`` of ``backing`` (as each start of a mount does)."""
    return lambda: Journal(tmp_path / "j", backing[1])


def test_replay_gives_the_live_entries_after_a_clean_close(
    tmp_path: Path, opened: Callable[[], Journal], boot: Path
) -> None:
    journal = opened()
    journal.rewrite([((1, 10), "a", TAG)])
    journal.put((1, 11), "b", TAG)
    journal.put((1, 10), "moved/a", TAG)
    journal.drop((1, 11))
    journal.close()
    boot.write_text("boot-2\n")  # a clean close is trusted across a reboot
    assert opened().replay() == {(1, 10): ("moved/a", TAG)}


def test_a_crash_on_the_same_boot_is_trusted_but_not_after_a_reboot(
    tmp_path: Path, opened: Callable[[], Journal], boot: Path
) -> None:
    journal = opened()
    journal.rewrite([])
    journal.put((1, 10), "a", TAG)  # never fsynced, never closed: a kill -9 here
    assert opened().replay() == {(1, 10): ("a", TAG)}
    boot.write_text("boot-2\n")  # the machine went down: unsynced appends may be gone
    assert opened().replay() is None


def test_a_start_that_finds_what_the_journal_holds_appends_to_it(
    tmp_path: Path, opened: Callable[[], Journal], boot: Path
) -> None:
    first = opened()
    first.rewrite([((1, 10), "a", TAG)])
    first.close()
    inode = os.stat(tmp_path / "j").st_ino
    boot.write_text("boot-2\n")  # a clean stop, then a reboot
    second = opened()
    entries = second.replay()
    assert entries == {(1, 10): ("a", TAG)}
    assert second.resume(entries)  # appended to, not rewritten
    assert os.stat(tmp_path / "j").st_ino == inode
    second.put((1, 11), "b", TAG)  # then a kill -9: a crash on this boot, trusted
    assert opened().replay() == {(1, 10): ("a", TAG), (1, 11): ("b", TAG)}
    boot.write_text("boot-3\n")  # not after the machine went down
    assert opened().replay() is None


def test_a_journal_that_differs_from_what_a_start_found_is_rewritten(
    tmp_path: Path, opened: Callable[[], Journal]
) -> None:
    first = opened()
    first.rewrite([((1, 10), "a", TAG)])
    first.close()
    second = opened()
    assert second.replay() is not None
    assert not second.resume({})  # the file is gone: the start rewrites
    with open(tmp_path / "j", "ab") as f:
        f.write(b"0badc0de [")  # torn: appending after it would bury the next record
    third = opened()
    entries = third.replay()
    assert entries == {(1, 10): ("a", TAG)} and not third.resume(entries)


def test_a_torn_last_record_is_ignored(
    tmp_path: Path, opened: Callable[[], Journal], caplog: pytest.LogCaptureFixture
) -> None:
    journal = opened()
    journal.rewrite([((1, 10), "a", TAG)])
    journal.put((1, 11), "b", TAG)
    with open(tmp_path / "j", "ab") as f:
        f.write(b'0badc0de ["p",1,12,"c')  # a crash mid-append
    with caplog.at_level(logging.WARNING):
        assert opened().replay() == {(1, 10): ("a", TAG), (1, 11): ("b", TAG)}
    assert "torn" in caplog.text
    with open(tmp_path / "j", "ab") as f:  # a whole line that does not check, last
        f.write(b'00000000 ["d",1,10]\n')
    assert opened().replay() == {(1, 10): ("a", TAG), (1, 11): ("b", TAG)}


def test_a_bad_record_before_the_last_makes_the_journal_unreadable(
    tmp_path: Path, opened: Callable[[], Journal], boot: Path
) -> None:
    journal = opened()
    journal.rewrite([((1, 10), "a", TAG)])
    journal.put((1, 11), "b", TAG)
    text = (tmp_path / "j").read_text().replace('"a"', '"x"')  # its checksum no longer holds
    (tmp_path / "j").write_text(text)
    assert opened().replay() is None
    assert list(tmp_path.glob("j.unreadable-*"))  # kept aside, not overwritten


def test_a_journal_that_is_not_backings_latest_is_not_trusted(
    tmp_path: Path, backing: tuple[Path, int], boot: Path
) -> None:
    _, fd = backing
    old = Journal(tmp_path / "old", fd)
    old.rewrite([((1, 10), "a", TAG)])
    old.close()
    Journal(tmp_path / "new", fd).rewrite([])  # another journal for the same BACKING since
    assert Journal(tmp_path / "old", fd).replay() is None
    assert Journal(tmp_path / "new", fd).replay() == {}
    os.removexattr(f"/proc/self/fd/{fd}", XATTR_JOURNAL)
    assert Journal(tmp_path / "new", fd).replay() is None


def test_the_journal_is_compacted_past_a_multiple_of_its_live_entries(
    tmp_path: Path, opened: Callable[[], Journal], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stageout_journal, "COMPACT_MIN", 10)
    journal = opened()
    journal.rewrite([((1, 1), "kept", TAG)])
    most = 0
    for i in range(2, 500):
        journal.put((1, i), f"f{i}", TAG)
        journal.drop((1, i))
        most = max(most, len((tmp_path / "j").read_text().splitlines()))
    # The header and the tag's definition, the records up to the bound, the one past it.
    assert most <= 2 + stageout_journal.COMPACT_FACTOR * 10 + 1
    assert opened().replay() == {(1, 1): ("kept", TAG)}


# ---------------------------------------------------------------------- restarts of StageOut


@pytest.fixture
def stages(tmp_path: Path, backing: tuple[Path, int], boot: Path) -> Iterator[object]:
    """``start(drain=True) -> StageOut`` over ``backing`` with the journal ``tmp_path/j``, to
    ``tmp_path/pfs`` (``drain=False``: no PFS, nothing copied); stopped at teardown (or by the
    test: stop is idempotent)."""
    path, fd = backing
    pfs = tmp_path / "pfs"
    pfs.mkdir()
    started: list[StageOut] = []

    def start(drain: bool = True) -> StageOut:
        journal = Journal(tmp_path / "j", fd)
        stage = StageOut(
            fd, path, pfs if drain else None, evict=False, hooks=Hooks(), journal=journal
        )
        started.append(stage)
        stage.start()
        return stage

    yield start
    for stage in started:
        stage.stop()


def _no_scan(*_: object) -> None:
    raise AssertionError("BACKING was scanned")


def test_a_restart_resumes_from_the_journal_without_a_scan(
    stages, tmp_path: Path, backing: tuple[Path, int], caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    path, _ = backing
    pfs = tmp_path / "pfs"
    with caplog.at_level(logging.INFO):
        first = stages(drain=False)  # tracks, copies nothing
    assert "no usable journal" in caplog.text  # none yet: the first start scans
    (path / "d").mkdir()
    for name in ("d/a", "b", "gone"):
        write_through(first, path / name, os.urandom(1000))
    first.forget(key_of(path / "gone"))
    os.unlink(path / "gone")
    first.stop()
    caplog.clear()
    monkeypatch.setattr(stageout_journal, "scan", _no_scan)
    with caplog.at_level(logging.INFO):
        second = stages()
    assert "resumed from the journal: 2 files (no scan of BACKING)" in caplog.text
    wait_until(lambda: second.copies == 2, message="the copies after the restart")
    for name in ("d/a", "b"):
        assert (pfs / name).read_bytes() == (path / name).read_bytes()
    second.stop()
    with caplog.at_level(logging.INFO):
        stages()  # and again: the journal rewritten at the last start holds them
    assert "resumed from the journal: 2 files" in caplog.text


def test_a_file_renamed_while_stopped_is_found_by_the_rescan(
    stages, tmp_path: Path, backing: tuple[Path, int], caplog: pytest.LogCaptureFixture
) -> None:
    path, _ = backing
    pfs = tmp_path / "pfs"
    first = stages(drain=False)
    data = os.urandom(5000)
    write_through(first, path / "a", data)
    first.stop()
    os.rename(path / "a", path / "b")  # behind the mount, while it was down
    with caplog.at_level(logging.INFO):
        second = stages()
    assert "1 not where recorded" in caplog.text
    wait_until(lambda: second.copies == 1, message="the copy of b")
    assert (pfs / "b").read_bytes() == data
    assert second.tracks(key_of(path / "b"))


def test_without_a_journal_file_a_start_scans_and_writes_one(
    stages, tmp_path: Path, backing: tuple[Path, int], caplog: pytest.LogCaptureFixture
) -> None:
    path, _ = backing
    first = stages(drain=False)
    write_through(first, path / "a", b"x" * 100)
    first.stop()
    (tmp_path / "j").unlink()
    with caplog.at_level(logging.INFO):
        stages(drain=False).stop()
    assert "no usable journal" in caplog.text and "scanning all of" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO):
        stages(drain=False)
    assert "resumed from the journal: 1 files" in caplog.text
