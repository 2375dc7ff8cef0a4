"""`fuse_shim.setid`: the kernel's rule for dropping set-user-ID / set-group-ID on a write,
and the writer's credentials read from ``/proc``."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from burstctl.fuse_shim.setid import CAP_FSETID, Writer, mode_after_write, writer_of

REG, DIR = stat.S_IFREG, stat.S_IFDIR
OUTSIDER = Writer(has_fsetid=False, groups=frozenset({65534}))  # not in group 100
MEMBER = Writer(has_fsetid=False, groups=frozenset({65534, 100}))
PRIVILEGED = Writer(has_fsetid=True, groups=frozenset({0}))

# (st_mode, writer, expected) for a file of group 100; None = unchanged.
# What Linux's setattr_should_drop_suidgid does (pjdfstest chmod/12.t for the first rows).
TABLE = [
    (REG | 0o4777, OUTSIDER, 0o777),
    (REG | 0o2777, OUTSIDER, 0o777),
    (REG | 0o6777, OUTSIDER, 0o777),
    (REG | 0o4777, MEMBER, 0o777),  # S_ISUID goes whoever writes
    (REG | 0o2777, MEMBER, 0o777),  # S_ISGID with S_IXGRP goes for a member too
    (REG | 0o6777, MEMBER, 0o777),
    (REG | 0o2767, MEMBER, None),  # S_ISGID without S_IXGRP, writer in the group: kept
    (REG | 0o2767, OUTSIDER, 0o767),  # ... not in the group: dropped
    (REG | 0o6767, MEMBER, 0o2767),  # only S_ISUID goes
    (REG | 0o4755, MEMBER, 0o755),  # the owner's own 4755 file loses S_ISUID
    (REG | 0o1777, OUTSIDER, None),  # the sticky bit is not touched
    (REG | 0o5777, OUTSIDER, 0o1777),
    (REG | 0o0777, OUTSIDER, None),
    (REG | 0o0644, OUTSIDER, None),
    (REG | 0o4777, PRIVILEGED, None),  # CAP_FSETID keeps everything
    (REG | 0o2777, PRIVILEGED, None),
    (REG | 0o6767, PRIVILEGED, None),
    (DIR | 0o6777, OUTSIDER, None),  # only regular files
]


@pytest.mark.parametrize(("mode", "writer", "expected"), TABLE)
def test_mode_after_write_follows_the_kernel(mode: int, writer: Writer, expected: int) -> None:
    assert mode_after_write(mode, 100, writer) == expected


def test_writer_of_this_process_reads_its_capabilities_and_groups() -> None:
    with open("/proc/self/status", encoding="ascii") as f:
        fields = dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)
    has_fsetid = bool(int(fields["CapEff"].strip(), 16) >> CAP_FSETID & 1)
    groups = {int(g) for g in fields["Groups"].split()}

    writer = writer_of(os.getpid(), 4242)

    assert writer.has_fsetid is has_fsetid
    assert writer.groups == frozenset(groups | {4242})  # the request's fsgid is one of them


def test_writer_of_a_thread_id() -> None:
    # Requests carry the calling thread's id: /proc/<tid>/status answers for it too.
    tids: list[int] = []
    started, done = threading.Event(), threading.Event()

    def run() -> None:
        tids.append(threading.get_native_id())
        started.set()
        done.wait(10)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        assert started.wait(10)
        assert tids[0] != os.getpid()
        assert writer_of(tids[0], 7) == writer_of(os.getpid(), 7)
    finally:
        done.set()
        thread.join(10)


@pytest.mark.parametrize("pid", [0, -1])
def test_no_pid_is_an_unprivileged_writer(pid: int) -> None:
    assert writer_of(pid, 5) == Writer(has_fsetid=False, groups=frozenset({5}))


def test_a_process_that_is_gone_is_an_unprivileged_writer() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(30)  # reaped: its pid is free (and cannot be anyone's before it is reused)
    writer = writer_of(child.pid, 9)
    if os.path.exists(f"/proc/{child.pid}"):  # reused already: then it is someone else
        pytest.skip("the pid was reused")
    assert writer == Writer(has_fsetid=False, groups=frozenset({9}))


# ------------------------------------------------------------------------ real children

# Waits on stdin after saying it runs (so its credentials are final, after setpriv's exec).
_WAIT = "import sys; print('ready', flush=True); sys.stdin.read()"


@pytest.fixture
def child() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()  # by pid: only what this test started
        proc.wait(10)
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                pipe.close()


def _start(started: list[subprocess.Popen[str]], *setpriv: str) -> int:
    proc = subprocess.Popen(
        ["setpriv", *setpriv, "--", sys.executable, "-I", "-c", _WAIT],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    started.append(proc)
    assert proc.stdout is not None
    assert proc.stdout.readline() == "ready\n"
    return proc.pid


needs_root_and_setpriv = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv"
)


@needs_root_and_setpriv
def test_writer_of_an_unprivileged_child(child: list[subprocess.Popen[str]]) -> None:
    pid = _start(child, "--reuid", "65534", "--regid", "65534", "--groups", "100,65533")
    assert writer_of(pid, 65534) == Writer(has_fsetid=False, groups=frozenset({100, 65533, 65534}))


@needs_root_and_setpriv
def test_writer_of_root_without_cap_fsetid(child: list[subprocess.Popen[str]]) -> None:
    if not writer_of(os.getpid(), 0).has_fsetid:
        pytest.skip("this process has no CAP_FSETID to drop")
    with_it = _start(child, "--clear-groups")
    without = _start(child, "--clear-groups", "--bounding-set", "-fsetid", "--inh-caps", "-all")
    assert writer_of(with_it, 0) == Writer(has_fsetid=True, groups=frozenset({0}))
    assert writer_of(without, 0) == Writer(has_fsetid=False, groups=frozenset({0}))
