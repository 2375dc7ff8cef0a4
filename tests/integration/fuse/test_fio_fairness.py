"""Fairness with real tools: two ``fio`` jobs through one mount, shares ∝ nodes.

A controller at B = 100 MiB/s with ``size-fair`` (ThemisIO: shares ∝ nodes; node bandwidth
1 GiB/s so no cap b_i binds) and one ``burstctl mount`` in front of it; the shim reads each fio
process's Slurm identity from ``/proc/<pid>/environ``. The jobs, phases and measurement are
tests/fio_fairness.py's.

Targets: A : B = 4 : 1 within 5 %, aggregate >= 95 % of B. Run with ``-s`` to
see the measured figures.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fio_fairness import WITHIN, measure

pytestmark = pytest.mark.integration


# Pacing sits above the binding, so this 40-second run is done on one library only: libfuse 3,
# what `--libfuse auto` takes as root (the POSIX, integrity and lifecycle tests cover both).
@pytest.mark.serial  # shares measured over a window: alone, not beside other tests
@pytest.mark.parametrize("libfuse", ["3"], indirect=True)
def test_two_fio_jobs_share_the_mount_in_proportion_to_their_nodes(
    controller_factory, fuse_mount, fuse_dirs, tmp_path: Path
) -> None:
    controller = controller_factory(
        "--policy", "size-fair", "--capacity", "100MiB/s", "--node-bandwidth", "1GiB/s"
    )
    backing, mountpoint = fuse_dirs
    fuse_mount(backing, mountpoint, "--controller", controller.address)
    summary = measure(mountpoint, tmp_path)
    print(json.dumps(summary))

    for rw, measured in summary.items():
        assert measured["contended_ratio"] == pytest.approx(4.0, rel=WITHIN), (rw, measured)
        assert measured["aggregate_of_B"] >= 0.95, (rw, measured)
