"""A metadata storm for the metadata QoS tests: a child process that creates and removes an
empty file in a loop, timing each operation itself.

``MetadataLoop(directory, env, argv_prefix)`` starts ``[*argv_prefix, python, -c, LOOP, dir]``:
it lists ``directory`` (metadata calls no cache answers: its job's session opens), says
``ready`` and waits for the test's ``go SECONDS``; then, for that long, it creates a file
(``open`` with ``O_CREAT | O_EXCL``), closes and removes it, and answers the CLOCK_MONOTONIC
time each create and each removal returned (two metadata operations per round). `ops_rate`
reads a rate from those times.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

if TYPE_CHECKING:
    from burstctl.controller.app import Replica

LOOP = r"""
import os, sys, time
d = sys.argv[1]
os.listdir(d)
print("ready", flush=True)
seconds = float(sys.stdin.readline().split()[1])
path, times = os.path.join(d, f"storm-{os.getpid()}"), []
end = time.monotonic() + seconds
while time.monotonic() < end:
    os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    times.append(time.monotonic())
    os.unlink(path)
    times.append(time.monotonic())
print(" ".join(f"{t:.6f}" for t in times), flush=True)
"""


class MetadataLoop:
    """One storm in a child process (stopped by pid in `close`)."""

    def __init__(
        self, directory: Path, env: dict[str, str], argv_prefix: Sequence[str] = ()
    ) -> None:
        self.proc = subprocess.Popen(
            [*argv_prefix, sys.executable, "-c", LOOP, str(directory)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )

    def ready(self) -> None:
        """Blocks until the child made its first metadata call (a dead child fails)."""
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.strip() == "ready", f"the storm did not start: {line!r}"

    def go(self, seconds: float) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"go {seconds}\n")
        self.proc.stdin.flush()

    def times(self, timeout: float = 60.0) -> list[float]:
        """When each operation returned (blocks until the storm is over)."""
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert self.proc.wait(timeout) == 0
        return [float(t) for t in line.split()]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()


async def limit_job(replica: Replica, job_id: str, ops: float) -> None:
    """Adds the operator's rule ``{"match": {"job": job_id}, "metadata_ops": ops}`` to
    ``replica`` (``POST /v1/rules``, with its admin token)."""
    token = (replica.config.state_dir / "admin-token").read_text().strip()
    rule = {"name": f"meta-{job_id}", "match": {"job": job_id}, "metadata_ops": ops}
    async with httpx.AsyncClient(
        base_url=replica.http_url, headers={"Authorization": f"Bearer {token}"}
    ) as http:
        answer = await http.post("/v1/rules", json=rule)
        assert answer.status_code == 201, answer.text


def ops_rate(times: Sequence[float], skip: float = 1.0) -> tuple[float, float]:
    """(operations per second, seconds measured) over the storm after its first ``skip``
    seconds: the operations that returned in ``(start + skip, last]`` over that span."""
    assert times, "the storm made no operation"
    start = times[0] + skip
    inside = [t for t in times if t > start]
    span = inside[-1] - start if inside else 0.0
    return (len(inside) / span if span > 0 else 0.0), span
