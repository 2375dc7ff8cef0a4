"""`JobInfo` validation and `JobInfo.from_env` with crafted environments."""

from __future__ import annotations

import dataclasses
import os
import pwd

import pytest

from burstctl.client import JobInfo
from burstctl.client.job import group_name, user_name

# An id no real account uses, to exercise the numeric fallback.
NO_SUCH_ID = 2**31 - 7


def test_valid_job_keeps_its_fields() -> None:
    job = JobInfo("123", "alice", "physics", nodes=8, priority=3)
    assert (job.job_id, job.user, job.group, job.nodes, job.priority) == (
        "123",
        "alice",
        "physics",
        8,
        3.0,
    )
    assert isinstance(job.priority, float)
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.nodes = 2  # type: ignore[misc]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"job_id": ""}, "job_id"),
        ({"job_id": "x" * 257}, "job_id"),
        ({"user": ""}, "user"),
        ({"group": ""}, "group"),
        ({"nodes": 0}, "nodes"),
        ({"nodes": True}, "nodes"),
        ({"nodes": 1.5}, "nodes"),
        ({"priority": 0}, "priority"),
        ({"priority": -1.0}, "priority"),
        ({"priority": float("inf")}, "priority"),
        ({"priority": float("nan")}, "priority"),
    ],
)
def test_invalid_fields_are_named(kwargs: dict[str, object], field: str) -> None:
    values: dict[str, object] = {"job_id": "1", "user": "u", "group": "g", **kwargs}
    with pytest.raises(ValueError, match=field):
        JobInfo(**values)  # type: ignore[arg-type]


def test_job_id_of_256_characters_is_fine() -> None:
    assert len(JobInfo("x" * 256, "u", "g").job_id) == 256


def test_from_env_prefers_burstctl_then_slurm_variables() -> None:
    env = {"BURSTCTL_JOB_ID": "b1", "SLURM_JOB_ID": "s1", "SLURM_JOBID": "s2"}
    assert JobInfo.from_env(env, uid=0, gid=0).job_id == "b1"
    del env["BURSTCTL_JOB_ID"]
    assert JobInfo.from_env(env, uid=0, gid=0).job_id == "s1"
    del env["SLURM_JOB_ID"]
    assert JobInfo.from_env(env, uid=0, gid=0).job_id == "s2"


def test_from_env_without_a_job_is_the_users_default_job() -> None:
    job = JobInfo.from_env({"SLURM_JOB_ID": "  "}, uid=0, gid=0)
    assert job.job_id == f"user:{pwd.getpwuid(0).pw_name}"
    assert (job.nodes, job.priority) == (1, 1.0)


def test_from_env_reads_nodes_and_priority() -> None:
    env = {"SLURM_JOB_ID": "9", "SLURM_NNODES": "3", "BURSTCTL_PRIORITY": "2.5"}
    job = JobInfo.from_env(env, uid=0, gid=0)
    assert (job.nodes, job.priority) == (3, 2.5)
    env["SLURM_JOB_NUM_NODES"] = "16"
    assert JobInfo.from_env(env, uid=0, gid=0).nodes == 16


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({"SLURM_JOB_NUM_NODES": "abc"}, "SLURM_JOB_NUM_NODES"),
        ({"SLURM_JOB_NUM_NODES": "0"}, "SLURM_JOB_NUM_NODES"),
        ({"SLURM_NNODES": "-2"}, "SLURM_NNODES"),
        ({"BURSTCTL_PRIORITY": "high"}, "BURSTCTL_PRIORITY"),
        ({"BURSTCTL_PRIORITY": "0"}, "BURSTCTL_PRIORITY"),
        ({"BURSTCTL_PRIORITY": "inf"}, "BURSTCTL_PRIORITY"),
    ],
)
def test_from_env_names_the_bad_variable(env: dict[str, str], variable: str) -> None:
    with pytest.raises(ValueError, match=variable):
        JobInfo.from_env(env, uid=0, gid=0)


def test_from_env_rejects_an_overlong_job_id() -> None:
    with pytest.raises(ValueError, match="SLURM_JOB_ID"):
        JobInfo.from_env({"SLURM_JOB_ID": "j" * 300}, uid=0, gid=0)


def test_unknown_ids_fall_back_to_numbers() -> None:
    job = JobInfo.from_env({}, uid=NO_SUCH_ID, gid=NO_SUCH_ID)
    assert (job.user, job.group, job.job_id) == (
        str(NO_SUCH_ID),
        str(NO_SUCH_ID),
        f"user:{NO_SUCH_ID}",
    )


def test_defaults_are_this_process() -> None:
    job = JobInfo.from_env({})
    assert job.user == user_name(os.geteuid())
    assert job.group == group_name(os.getegid())


def test_from_env_does_not_read_the_real_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "from-os")
    assert JobInfo.from_env({}, uid=0, gid=0).job_id.startswith("user:")
    assert JobInfo.from_env(uid=0, gid=0).job_id == "from-os"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("job_id", "job\x00id"),
        ("user", "x" * 257),
        ("group", ""),
        ("nodes", (1 << 20) + 1),
        ("priority", 2e9),
    ],
)
def test_what_a_controller_would_refuse_is_refused_here(field: str, value: object) -> None:
    fields: dict[str, object] = {"job_id": "1", "user": "u", "group": "g", field: value}
    with pytest.raises(ValueError, match=field):
        JobInfo(**fields)  # type: ignore[arg-type]
