"""pid -> job attribution, with real child processes whose environments the test chooses."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from support import clean_env

from burstctl.client.job import group_name, user_name
from burstctl.node.attribution import Attributor, Caller, default_job, read_process

UID, GID = os.getuid(), os.getgid()
ME = user_name(UID)
# Blocks until its stdin closes, after printing its pid.
WAIT = "import os, sys; print(os.getpid(), flush=True); sys.stdin.read()"


def reads_up_to_the_test_process(pid: int) -> tuple[Mapping[str, str] | None, int | None]:
    """`read_process`, blind at this test process: whatever job the test runner's own
    environment might name (e.g. on a Slurm node) must not leak into the expectations."""
    if pid == os.getpid():
        return None, None
    return read_process(pid)


class Children:
    """Starts child processes and stops each one by pid at the end of the test."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, env: dict[str, str], argv: list[str] | None = None) -> int:
        clean = clean_env(("BURSTCTL_", "SLURM_"))
        proc = subprocess.Popen(
            argv or [sys.executable, "-c", WAIT],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**clean, **env},
        )
        self.procs.append(proc)
        assert proc.stdout is not None
        return int(proc.stdout.readline())  # the pid of the process that will do I/O

    def stop(self) -> None:
        for proc in self.procs:
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.close()
            proc.wait(10)
            proc.stdout.close()


@pytest.fixture
def children() -> Iterator[Children]:
    kids = Children()
    yield kids
    kids.stop()


def attributor(**kwargs: object) -> Attributor:
    return Attributor(read_process=reads_up_to_the_test_process, **kwargs)  # type: ignore[arg-type]


def test_the_job_comes_from_the_callers_environment(children: Children) -> None:
    pid = children.start(
        {"BURSTCTL_JOB_ID": "j42", "SLURM_JOB_NUM_NODES": "16", "BURSTCTL_PRIORITY": "3"}
    )
    job = attributor().job_for(Caller(pid, UID, GID))
    assert (job.job_id, job.nodes, job.priority) == ("j42", 16, 3.0)
    assert (job.user, job.group) == (ME, group_name(GID))


@pytest.mark.parametrize("var", ["SLURM_JOB_ID", "SLURM_JOBID"])
def test_slurm_variables_name_the_job(children: Children, var: str) -> None:
    pid = children.start({var: "777", "SLURM_NNODES": "2"})
    job = attributor().job_for(Caller(pid, UID, GID))
    assert (job.job_id, job.nodes) == ("777", 2)


def test_user_and_group_come_from_the_request_not_the_environment(children: Children) -> None:
    pid = children.start({"BURSTCTL_JOB_ID": "j1", "USER": "mallory"})
    job = attributor().job_for(Caller(pid, 0, 0))
    assert (job.user, job.group) == (user_name(0), group_name(0))


def test_a_process_without_a_job_takes_its_parents(children: Children) -> None:
    # sh has the job; the python it starts has an empty environment (env -i).
    pid = children.start(
        {"SLURM_JOB_ID": "parental", "SLURM_NNODES": "3"},
        ["/bin/sh", "-c", f'env -i {sys.executable} -c "$0"; exit $?', WAIT],
    )
    assert Path(f"/proc/{pid}/environ").read_bytes() == b""
    job = attributor().job_for(Caller(pid, UID, GID))
    assert (job.job_id, job.nodes) == ("parental", 3)


def test_without_a_job_anywhere_the_caller_gets_its_uids_default_job(children: Children) -> None:
    pid = children.start({})
    job = attributor().job_for(Caller(pid, UID, GID))
    assert job == default_job(UID, GID)
    assert job.job_id == f"user:{ME}"


def test_unknown_pids_get_the_default_job_of_their_uid() -> None:
    attr = attributor()
    assert attr.job_for(Caller(0, 65534, 65534)).job_id == f"user:{user_name(65534)}"
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert attr.job_for(Caller(int(gone.stdout), UID, GID)).job_id == f"user:{ME}"


def test_an_invalid_environment_falls_back_to_the_default_job(
    children: Children, caplog: pytest.LogCaptureFixture
) -> None:
    pid = children.start({"BURSTCTL_JOB_ID": "bad", "SLURM_NNODES": "many"})
    with caplog.at_level(logging.WARNING, "burstctl.node.attribution"):
        job = attributor().job_for(Caller(pid, UID, GID))
    assert job.job_id == f"user:{ME}"
    assert "SLURM_NNODES" in caplog.text


def test_who_came_first_owns_nothing_the_controller_decides(
    children: Children, caplog: pytest.LogCaptureFixture
) -> None:
    # Issue 15, finding 3: the first uid to name a job used to own it in the mount, so an
    # intruder that came first took a job registered to another user and pushed the owner's
    # own I/O to its default job.
    intruder = children.start({"BURSTCTL_JOB_ID": "777"})
    owner = children.start({"BURSTCTL_JOB_ID": "777"})
    attr = attributor()
    other_uid = UID + 4242
    assert attr.job_for(Caller(intruder, other_uid, GID)).job_id == "777"
    assert attr.job_for(Caller(owner, UID, GID)).job_id == "777"  # not pushed aside
    # The controller refused the intruder's uid a session of 777 (the pacer says so):
    with caplog.at_level(logging.WARNING, "burstctl.node.attribution"):
        attr.deny("777", other_uid, "PERMISSION_DENIED: registered to another user")
        job = attr.job_for(Caller(intruder, other_uid, GID))  # the cached answer is dropped
        attr.forget()
        attr.job_for(Caller(intruder, other_uid, GID))
    assert job == default_job(other_uid, GID)
    assert attr.denied("777", other_uid) and not attr.denied("777", UID)
    assert caplog.text.count("names job '777'") == 1  # warned once per (job, uid)
    assert attr.job_for(Caller(owner, UID, GID)).job_id == "777"


def test_nobody_may_name_another_users_default_job(children: Children) -> None:
    pid = children.start({"BURSTCTL_JOB_ID": "user:root"})
    uid = 4242 if UID == 0 else UID
    job = attributor().job_for(Caller(pid, uid, GID))
    assert job == default_job(uid, GID)


def test_answers_are_cached_per_pid_until_they_expire(children: Children) -> None:
    pid = children.start({"BURSTCTL_JOB_ID": "cached"})
    now = [100.0]
    attr = attributor(ttl=5.0, clock=lambda: now[0])
    caller = Caller(pid, UID, GID)
    for _ in range(10):
        assert attr.job_for(caller).job_id == "cached"
    assert attr.lookups == 1
    now[0] += 4.9
    attr.job_for(caller)
    assert attr.lookups == 1
    now[0] += 0.2  # past the ttl: /proc is read again
    attr.job_for(caller)
    assert attr.lookups == 2
    # The cache key holds the credentials: another uid on the same pid is looked up anew.
    attr.job_for(Caller(pid, UID + 1, GID))
    assert attr.lookups == 3


def test_an_expired_answer_sees_a_changed_process() -> None:
    # A reused pid (or a process that exec'd with another environment) after the ttl.
    envs = {1234: {"BURSTCTL_JOB_ID": "before"}}
    now = [0.0]
    attr = Attributor(ttl=1.0, clock=lambda: now[0], read_process=lambda pid: (envs.get(pid), None))
    caller = Caller(1234, 5000, 5000)
    assert attr.job_for(caller).job_id == "before"
    envs[1234] = {"BURSTCTL_JOB_ID": "after"}
    assert attr.job_for(caller).job_id == "before"
    now[0] = 1.5
    assert attr.job_for(caller).job_id == "after"


def test_the_ancestor_walk_is_bounded_and_survives_cycles() -> None:
    chain = {p: ({}, p - 1) for p in range(2, 100)}
    chain[50] = ({"BURSTCTL_JOB_ID": "far"}, 49)
    attr = Attributor(max_ancestors=8, read_process=lambda pid: chain.get(pid, (None, None)))
    assert attr.job_for(Caller(99, 5000, 5000)).job_id == "user:" + user_name(5000)
    assert attr.job_for(Caller(55, 5000, 5000)).job_id == "far"
    loop = {7: ({}, 8), 8: ({}, 7)}
    attr = Attributor(read_process=lambda pid: loop.get(pid, (None, None)))
    assert attr.job_for(Caller(7, 5000, 5000)).job_id == "user:" + user_name(5000)
