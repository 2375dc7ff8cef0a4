"""Windows through a real mount (issue 17): an application writing through ``burstctl mount``
is paced to the periodic pattern of windows its job's allocation carries, unchanged (the mount
paces through the client sessions). The scripted controller sends the pattern; the mount and
the application are child processes; CLOCK_MONOTONIC is the same in all of them, so the
application's completion times are compared with the pattern as the controller phased it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from fake_controller import FakeController
from support import MountProcess
from test_mount_pacing import App, apps, stream_of  # noqa: F401 (apps: a fixture)

from burstctl.proto.burstctl.v1 import controller_pb2 as pb

pytestmark = pytest.mark.integration

MiB = 1 << 20
KiB = 1 << 10
R = 4 * MiB
PERIOD, END = 1.0, 0.3
CHUNK = 16 * KiB
EPOCH = 100
# A write that returns this long after its window's end still counts as inside: the wake-up
# of the mount's thread and the kernel's reply.
LATE = 0.05


def late_by(t: float) -> float:
    phase = t % PERIOD
    return 0.0 if phase <= END else phase - END


# Pacing sits above the binding: one library is enough (libfuse 3, as test_fio_fairness).
@pytest.mark.serial  # the rate is measured over whole periods: alone, not beside other tests
@pytest.mark.parametrize("libfuse", ["3"], indirect=True)
def test_writes_through_the_mount_follow_the_windows(
    fake_controller: Callable[..., FakeController],
    fuse_mount: Callable[..., MountProcess],
    fuse_dirs: tuple[Path, Path],
    apps: Callable[..., App],  # noqa: F811
) -> None:
    fake = fake_controller(initial_rate=1 * MiB, burst=64 * KiB)
    backing, mnt = fuse_dirs
    fuse_mount(backing, mnt, "--controller", fake.address)
    app = apps({"BURSTCTL_JOB_ID": "periodic"})
    app.do("open", mnt / "f")
    app.do("write", mnt / "f", 4 * KiB)  # the job's session is open
    stream = stream_of(fake, "periodic")
    # Periods start at whole seconds of CLOCK_MONOTONIC: the origin is the time to the next.
    origin = (-time.monotonic()) % PERIOD
    windows = pb.Windows(
        period_seconds=PERIOD,
        origin_seconds=origin,
        window=[pb.Window(start_seconds=0.0, end_seconds=END, rate=R)],
    )
    fake.push(END * R, stream=stream, epoch=EPOCH, windows=windows)
    fake.wait_for(
        lambda: any(u.applied_epoch >= EPOCH for u in fake.bodies("usage", stream)), timeout=10
    )

    # Flat out for 3.6 periods, each write's return timed by the application itself.
    done = app.write_times("writes_for", mnt / "f", CHUNK, 3.6 * PERIOD)
    app.do("close", mnt / "f")
    app.exit()

    outside = [t for t in done if late_by(t) > LATE]
    assert len(outside) <= 0.01 * len(done), (
        f"{len(outside)} of {len(done)} writes returned outside the windows, "
        f"late by up to {max(late_by(t) for t in outside):.3f} s"
    )
    first, last = int(done[0] // PERIOD) + 1, int(done[-1] // PERIOD)
    assert last - first >= 2
    moved = CHUNK * sum(1 for t in done if first * PERIOD <= t < last * PERIOD)
    rate = moved / ((last - first) * PERIOD)
    assert rate == pytest.approx(END * R, rel=0.10), f"{rate / MiB:.3f} MiB/s"
