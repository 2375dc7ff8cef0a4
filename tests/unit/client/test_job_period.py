"""A job's declared period (issue 17, policy persched): JobInfo's fields and environment."""

from __future__ import annotations

import math

import pytest

from burstctl.client.job import JobInfo


def test_a_declared_period_is_kept_as_floats() -> None:
    job = JobInfo("j", "ann", "phys", w=2, vol_io=1 << 20)
    assert (job.w, job.vol_io) == (2.0, float(1 << 20))
    assert JobInfo("j", "ann", "phys").w is None


@pytest.mark.parametrize(
    ("w", "vol_io", "field"),
    [
        (1.0, None, "vol_io"),
        (None, 5.0, "w"),
        (-1.0, 5.0, "w"),
        (math.nan, 5.0, "w"),
        (math.inf, 5.0, "w"),
        (1.0, -5.0, "vol_io"),
        (1.0, 2.0**60, "vol_io"),
        (True, 5.0, "w"),
    ],
)
def test_a_bad_period_is_refused_naming_the_field(
    w: float | None, vol_io: float | None, field: str
) -> None:
    with pytest.raises(ValueError, match=f"^{field} "):
        JobInfo("j", "ann", "phys", w=w, vol_io=vol_io)


def test_the_period_comes_from_the_environment() -> None:
    env = {"BURSTCTL_JOB_ID": "7", "BURSTCTL_PERIOD_W": "0.5", "BURSTCTL_PERIOD_VOL": "4MiB"}
    job = JobInfo.from_env(env, uid=0, gid=0)
    assert (job.w, job.vol_io) == (0.5, float(4 << 20))
    assert JobInfo.from_env({"BURSTCTL_JOB_ID": "7"}, uid=0, gid=0).w is None


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"BURSTCTL_PERIOD_W": "soon", "BURSTCTL_PERIOD_VOL": "1"}, "BURSTCTL_PERIOD_W"),
        ({"BURSTCTL_PERIOD_W": "-2", "BURSTCTL_PERIOD_VOL": "1"}, "BURSTCTL_PERIOD_W"),
        ({"BURSTCTL_PERIOD_W": "1", "BURSTCTL_PERIOD_VOL": "lots"}, "BURSTCTL_PERIOD_VOL"),
        ({"BURSTCTL_PERIOD_W": "1", "BURSTCTL_PERIOD_VOL": "0"}, "BURSTCTL_PERIOD_VOL"),
        ({"BURSTCTL_PERIOD_W": "1"}, "vol_io must be set too"),
    ],
)
def test_a_bad_period_in_the_environment_names_the_variable(
    env: dict[str, str], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        JobInfo.from_env({"BURSTCTL_JOB_ID": "7", **env}, uid=0, gid=0)
