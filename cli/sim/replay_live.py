"""``burstctl sim replay --live``: a replay's jobs driven as real client sessions against a live
controller, time-scaled, and their yields beside the simulator's (docs/simulator.md,
"Darshan replay", "Live").

Owns the driver: the window that ``simulator/replay/mapping.py`` made for the simulator
(the one mapping) is run at ``time_scale`` simulated seconds per live second on a
controller of capacity B_live, each volume scaled by B_live / (B·time_scale) so that every
phase lasts its simulated length / time_scale at the job's cap. One `Session` per job
(``nodes`` = its ranks, so the controller's cap min(p_i·b_live, B_live) is the simulator's
b_i scaled), all on one `ClientRuntime` as on one client node, one thread per job: an I/O
phase is one explicit operation (a write: the model has one kind of I/O) whose bytes are
acquired in chunks of ``CHUNK_SECONDS`` at the cap, a work phase a wait. At T / time_scale
every job stops; its yield is its progress P (work seconds done, bytes moved / its cap, in
simulated seconds) over T, as the simulator's ([BWS] eq. (8)).

The tolerance (``tolerance``): each phase start or end of any job takes the controller one
decision and a push to reach the sessions, during which every job runs at its old rate;
each job's bucket may hold ``burst_window`` seconds of its rate when a phase starts; a
job's progress is counted in whole chunks. Each such event moves a job's P by at most
their sum in live seconds, so a yield moves by at most events × (latency + burst window
+ chunk) / (T / time_scale). The controller's 0.25 s usage reports only change what
policies that read a job's moved volume see, not the rates of those that do not.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import click

from burstctl.client import ClientRuntime, JobInfo, Session
from burstctl.common.units import format_rate
from burstctl.controller.config import ControllerConfig
from burstctl.simulator.replay.mapping import Replay
from burstctl.simulator.replay.runs import PolicyReplay

CHUNK_SECONDS = 0.01  # an acquire moves this long at the job's cap
LIVE_SECONDS = 30.0  # the default replay's length
USER = "replay"  # every job's user and group, as the simulator's one "sim" user
# What one phase event may cost a job's progress, live seconds: the end-to-end decision
# latency on loopback (a decision, its push and the session applying it) with margin for a
# loaded machine; the controller's default bucket depth.
DECISION_LATENCY = 0.02
BURST_WINDOW: float = ControllerConfig.model_fields["burst_window"].default
START_DELAY = 0.5  # from the threads' start to the replay's t = 0, live seconds
UNREGISTERED_NODES = "BURSTCTL_MAX_UNREGISTERED_NODES"


@dataclass(frozen=True, slots=True)
class LiveJob:
    """One job's live run: its yield at T and what it moved."""

    name: str
    yield_: float
    progress: float  # P at T, simulated seconds
    moved: int  # bytes acquired before T


def controller_flags(replay: Replay, live_bandwidth: float) -> list[str]:
    """The flags a controller needs for a live replay at ``live_bandwidth`` (its B)."""
    b_live = replay.node_bandwidth * live_bandwidth / replay.bandwidth
    return ["--capacity", f"{live_bandwidth:.0f}", "--node-bandwidth", f"{b_live:.0f}"]


def controller_env(replay: Replay) -> dict[str, str]:
    """The environment a controller needs for a live replay: the jobs are not registered,
    and a controller clamps what an unregistered job's session claims to
    ``max_unregistered_nodes`` (docs/security.md), which must admit every job's ranks."""
    default = ControllerConfig.model_fields["max_unregistered_nodes"].default
    return {UNREGISTERED_NODES: str(max(default, *(j.ranks for j in replay.jobs)))}


def controller_command(replay: Replay, live_bandwidth: float, policy: str | None) -> str:
    """The command line of a controller for a live replay, as a shell would take it."""
    env = " ".join(f"{k}={v}" for k, v in controller_env(replay).items())
    chosen = ["--policy", policy] if policy is not None else []
    return " ".join(
        [env, "burstctl controller", *chosen, *controller_flags(replay, live_bandwidth)]
    )


def default_time_scale(replay: Replay) -> float:
    return replay.window.horizon / LIVE_SECONDS


def tolerance(replay: Replay, time_scale: float) -> float:
    """The largest difference between a live and a simulated yield the replay accounts for
    (the module's docstring)."""
    events = 2 * sum(replay.io_phases(i) for i in range(len(replay.jobs)))
    per_event = DECISION_LATENCY + BURST_WINDOW + CHUNK_SECONDS
    return events * per_event / (replay.window.horizon / time_scale)


def replay_live(
    replay: Replay, address: str, live_bandwidth: float, time_scale: float
) -> list[LiveJob]:
    """Drives ``replay``'s jobs against the controller at ``address`` (run as
    `controller_command` says) and returns each job's live yield, in the jobs' order."""
    if not time_scale > 0.0:
        raise ValueError(f"time_scale must be > 0, got {time_scale}")
    width = len(str(max(len(replay.jobs) - 1, 0)))
    # one loop thread and one Node stream for all the jobs, as on one client node
    runtime = ClientRuntime(name="burstctl-replay")
    sessions = [
        Session(
            address,
            JobInfo(f"{i:0{width}d}-{_job_id(job.name)}", USER, USER, job.ranks),
            runtime=runtime,
        )
        for i, job in enumerate(replay.jobs)
    ]
    try:
        for job, session in zip(replay.jobs, sessions, strict=True):
            if not session.wait_attached(10.0):
                raise click.ClickException(f"{address}: the session of {job.name} did not attach")
        start = time.monotonic() + START_DELAY
        deadline = start + replay.window.horizon / time_scale
        results: list[LiveJob | BaseException | None] = [None] * len(sessions)

        def drive(i: int) -> None:
            try:
                results[i] = _run_phases(
                    replay, i, sessions[i], live_bandwidth, time_scale, start, deadline
                )
            except BaseException as exc:  # raised below, in the caller's thread
                results[i] = exc

        threads = [
            threading.Thread(target=drive, args=(i,), name=f"replay-{i}")
            for i in range(len(sessions))
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        for session in sessions:
            session.close()
        runtime.close()
    done = []
    for result in results:
        if not isinstance(result, LiveJob):
            cause = result if isinstance(result, BaseException) else None
            raise RuntimeError(f"a job's driver failed: {result!r}") from cause
        done.append(result)
    return done


def _run_phases(
    replay: Replay,
    i: int,
    session: Session,
    live_bandwidth: float,
    time_scale: float,
    start: float,
    deadline: float,
) -> LiveJob:
    """Job ``i``'s phases until they end or the deadline comes; its progress then."""
    app = replay.window.apps[i]
    to_bytes = live_bandwidth / time_scale  # a normalised volume's bytes live
    chunk = max(1, int(app.cap * live_bandwidth * CHUNK_SECONDS))
    progress = 0.0  # simulated seconds
    moved = 0
    _sleep_until(start)
    for phase in app.phases:
        now = time.monotonic()
        if now >= deadline:
            break
        if not phase.io:
            live = phase.value / time_scale
            _sleep_until(min(now + live, deadline))
            progress += min(time.monotonic() - now, deadline - now, live) * time_scale
            continue
        total = round(phase.value * to_bytes)
        done = 0
        with session.operation("write", volume=total):
            while done < total:
                n = min(chunk, total - done)
                session.acquire(n)
                if time.monotonic() > deadline:
                    break
                done += n
        moved += done
        # P grows by volume / b_i in I/O: the share of the phase done, at its length
        progress += phase.value / app.cap * (done / total if total else 1.0)
        if done < total:
            break
    T = replay.window.horizon
    return LiveJob(replay.jobs[i].name, progress / T, progress, moved)


def _sleep_until(when: float) -> None:
    # The modelled computation of a work phase: the driver's job is to take this long.
    delay = when - time.monotonic()
    if delay > 0:
        time.sleep(delay)


def _job_id(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:64]


def emit_live(
    replay: Replay,
    simulated: PolicyReplay,
    address: str,
    live_bandwidth: float,
    time_scale: float | None,
    fmt: str,
) -> None:
    """Runs the live replay and prints its yields beside the simulator's."""
    if simulated.result is None:
        raise click.ClickException(f"{simulated.policy}: the simulation failed: {simulated.error}")
    scale = time_scale if time_scale is not None else default_time_scale(replay)
    click.echo(
        f"live: {address}, {simulated.policy}, T = {replay.window.horizon:.6g} s in"
        f" {replay.window.horizon / scale:.3g} s (time scale {scale:.6g}); the controller:"
        f" {controller_command(replay, live_bandwidth, simulated.policy)}",
        err=True,
    )
    live = replay_live(replay, address, live_bandwidth, scale)
    rows = side_by_side(replay, simulated.yields, live, scale)
    if fmt == "json":
        click.echo(json.dumps({"policy": simulated.policy, "time_scale": scale, "jobs": rows}))
        return
    click.echo(
        f"B_live = {format_rate(live_bandwidth)}, tolerance ±{rows[0]['tolerance']:.4f}"
        if rows
        else ""
    )
    click.echo(f"{'job':<24}  {'simulated':>9}  {'live':>9}  {'difference':>10}")
    for row in rows:
        click.echo(
            f"{row['job']:<24}  {row['simulated']:>9.4f}  {row['live']:>9.4f}"
            f"  {row['difference']:>+10.4f}"
        )


def side_by_side(
    replay: Replay, simulated: Sequence[float], live: Sequence[LiveJob], time_scale: float
) -> list[dict[str, float | str]]:
    """Per job: the simulated and live yields, their difference and the tolerance."""
    tol = tolerance(replay, time_scale)
    return [
        {
            "job": job.name,
            "simulated": sim,
            "live": run.yield_,
            "difference": run.yield_ - sim,
            "tolerance": tol,
        }
        for job, sim, run in zip(replay.jobs, simulated, live, strict=True)
    ]
