"""Live fairness: ThemisIO's experiments at small scale through the real controller.

Starts ``burstctl controller`` as a child process on a loopback port with a
configured capacity B (default 50 MiB/s, node bandwidth high enough that no
job's cap b_i binds), then runs each scenario's jobs as real client sessions
whose threads acquire flat out. A sampler records every job's granted bytes
every 50 ms. Per scenario it prints, as JSON: the target shares (the paper's
exact values, written out here, not computed by the policy under test), the
measured shares over the steady part of the contention window, the maximum
error, the time from contention start until every job is within 3 % of its
target, and the aggregate throughput as a fraction of B. With ``--plot-dir`` it
writes a per-job throughput plot per scenario (PNG, like the paper's
Figures 8–10; needs the ``plot`` extra).

Targets: max error <= 1 %, converged within 1 s, aggregate >= 99 % of B.

    python bench/fairness.py [--scenario NAME ...] [--scale 1.0] [--plot-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

from controller_events import start_controller

from burstctl.client import JobInfo, Session

MiB = 1 << 20
CAPACITY = 50 * MiB
NODE_BANDWIDTH = 1 << 30  # 1 GiB/s per node: b_i = min(p_i·b, B) = B, caps never bind
CHUNK = 16 * 1024  # small enough that a 2.3 MiB/s job moves ~150 chunks a second
SAMPLE = 0.05  # seconds between samples
WITHIN = 0.03  # "within 3 %"
WINDOW = 0.5  # seconds: the sliding window the convergence time is judged on
SETTLE = 1.0  # seconds after contention starts before steady shares are measured
TARGET_ERROR = 0.01  # the targets: max relative error of a share,
TARGET_CONVERGENCE = 1.0  # seconds to be within 3 %,
TARGET_AGGREGATE = 0.99  # and aggregate throughput as a fraction of B


@dataclass(frozen=True)
class JobSpec:
    """One job: its metadata, when it runs (seconds from the scenario start, before
    ``--scale``) and how many threads acquire for it flat out."""

    job_id: str
    user: str
    group: str = "g"
    nodes: int = 1
    priority: float = 1.0
    start: float = 0.0
    stop: float | None = None  # None: until the scenario ends
    threads: int = 2


@dataclass(frozen=True)
class Scenario:
    name: str
    policy: str
    jobs: tuple[JobSpec, ...]
    duration: float
    contention: tuple[float, float]  # [start, end) when every job runs
    targets: dict[str, Fraction]  # exact share of B per job during contention
    alone: tuple[str, tuple[float, float]] | None = None  # a job running alone, and when


def _f(*shares: str) -> list[Fraction]:
    return [Fraction(s) for s in shares]


def _four_v_one(name: str, policy: str, targets: list[Fraction]) -> Scenario:
    """§5.3's 4v1: a 4-node job A alone for 60 s, a 1-node job B joining at +15 s
    for 30 s; here 1/10 of those times."""
    return Scenario(
        name=name,
        policy=policy,
        jobs=(
            JobSpec("A", user="ua", nodes=4),
            JobSpec("B", user="ub", nodes=1, start=1.5, stop=4.5),
        ),
        duration=6.0,
        contention=(1.5, 4.5),
        targets=dict(zip("AB", targets, strict=True)),
        alone=("A", (0.5, 1.5)),
    )


def _together(
    name: str,
    policy: str,
    jobs: list[tuple[str, str, int, str]],
    groups: dict[str, str] | None = None,
) -> Scenario:
    """Jobs (id, user, nodes, target share) all running for 3 s; group by user."""
    return Scenario(
        name=name,
        policy=policy,
        jobs=tuple(
            JobSpec(j, user=u, group=(groups or {}).get(u, "g"), nodes=n) for j, u, n, _ in jobs
        ),
        duration=3.0,
        contention=(0.0, 3.0),
        targets={j: Fraction(share) for j, _, _, share in jobs},
    )


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in [
        _four_v_one("size-fair-4v1", "size-fair", _f("4/5", "1/5")),
        _four_v_one("job-fair-4v1", "job-fair", _f("1/2", "1/2")),
        # user 1 with two 2-node jobs, user 2 with one 1-node job
        _together(
            "user-fair",
            "user-fair",
            [("u1a", "u1", 2, "1/4"), ("u1b", "u1", 2, "1/4"), ("u2a", "u2", 1, "1/2")],
        ),
        # Figure 9: two users, sizes 1 and 2 for one, 4 and 6 for the other
        _together(
            "user-size-fair",
            "user>size",
            [
                ("a1", "ua", 1, "1/6"),
                ("a2", "ua", 2, "1/3"),
                ("b4", "ub", 4, "1/5"),
                ("b6", "ub", 6, "3/10"),
            ],
        ),
        # Figures 10/11: G1{U1{J1:1}}, G2{U2{J2:2, J3:3, J4:2}, U3{J5:3, J6:2}, U4{J7:1, J8:2}}
        _together(
            "group-user-size-fair",
            "group>user>size",
            [
                ("j1", "u1", 1, "1/2"),
                ("j2", "u2", 2, "1/21"),
                ("j3", "u2", 3, "1/14"),
                ("j4", "u2", 2, "1/21"),
                ("j5", "u3", 3, "1/10"),
                ("j6", "u3", 2, "1/15"),
                ("j7", "u4", 1, "1/18"),
                ("j8", "u4", 2, "1/9"),
            ],
            groups={"u1": "g1", "u2": "g2", "u3": "g2", "u4": "g2"},
        ),
    ]
}


@dataclass
class _Job:
    spec: JobSpec
    moved: int = 0
    errors: list[BaseException] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _run_job(address: str, job: _Job, t0: float, scale: float, end: float, stop: threading.Event):
    spec = job.spec
    start_at = t0 + spec.start * scale
    stop_at = t0 + (spec.stop if spec.stop is not None else end) * scale
    if stop.wait(max(0.0, start_at - time.monotonic())):
        return
    info = JobInfo(spec.job_id, spec.user, spec.group, spec.nodes, spec.priority)
    with Session(address, info) as session:

        def pump() -> None:
            while time.monotonic() < stop_at and not stop.is_set():
                try:
                    session.acquire(CHUNK, "write")
                except BaseException as exc:  # reported in the result, never swallowed
                    job.errors.append(exc)
                    return
                with job.lock:
                    job.moved += CHUNK

        pumps = [threading.Thread(target=pump, daemon=True) for _ in range(spec.threads)]
        for p in pumps:
            p.start()
        for p in pumps:
            p.join()


@dataclass
class Run:
    """Samples (seconds from start, bytes moved per job) of one scenario run."""

    scenario: Scenario
    scale: float
    times: list[float]
    moved: list[dict[str, int]]
    errors: dict[str, list[str]]

    def rates(self, a: float, b: float) -> dict[str, float]:
        """Bytes/s per job over the sampled interval closest to [a, b] (scaled seconds)."""
        i = min(range(len(self.times)), key=lambda k: abs(self.times[k] - a))
        j = min(range(len(self.times)), key=lambda k: abs(self.times[k] - b))
        span = self.times[j] - self.times[i]
        return {job: (self.moved[j][job] - self.moved[i][job]) / span for job in self.moved[j]}

    def shares(self, a: float, b: float) -> dict[str, float]:
        rates = self.rates(a, b)
        total = sum(rates.values())
        return {job: rates[job] / total if total else 0.0 for job in self.scenario.targets}

    def error(self, shares: dict[str, float]) -> float:
        """Largest relative error of a share against its target."""
        return max(abs(shares[j] - float(t)) / float(t) for j, t in self.scenario.targets.items())

    def convergence(self) -> float | None:
        """Seconds from contention start until the shares over [t, t + WINDOW] are
        within 3 % of the targets; None if that never happens."""
        start, end = (x * self.scale for x in self.scenario.contention)
        for t in self.times:
            if t < start or t + WINDOW > end:
                continue
            if self.error(self.shares(t, t + WINDOW)) <= WITHIN:
                return t - start
        return None

    def summary(self) -> dict[str, object]:
        s = self.scenario
        start, end = (x * self.scale for x in s.contention)
        steady = (start + SETTLE * min(1.0, self.scale), end - SAMPLE)
        shares = self.shares(*steady)
        rates = self.rates(*steady)
        out: dict[str, object] = {
            "scenario": s.name,
            "policy": s.policy,
            "capacity_mib_s": CAPACITY / MiB,
            "steady_window_s": [round(x, 2) for x in steady],
            "target": {j: round(float(t), 4) for j, t in s.targets.items()},
            "measured": {j: round(v, 4) for j, v in shares.items()},
            "rate_mib_s": {j: round(v / MiB, 2) for j, v in rates.items()},
            "max_error": round(self.error(shares), 4),
            "converged_s": _round(self.convergence()),
            "aggregate_of_B": round(sum(rates.values()) / CAPACITY, 4),
            "errors": self.errors,
        }
        converged = self.convergence()
        out["meets_targets"] = (
            self.error(shares) <= TARGET_ERROR
            and converged is not None
            and converged <= TARGET_CONVERGENCE
            and sum(rates.values()) >= TARGET_AGGREGATE * CAPACITY
        )
        if s.alone is not None:
            job, (a, b) = s.alone
            out["alone"] = {
                "job": job,
                "of_B": round(self.rates(a * self.scale, b * self.scale)[job] / CAPACITY, 4),
            }
        return out


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def run_scenario(scenario: Scenario, address: str, scale: float = 1.0) -> Run:
    """Runs ``scenario``'s jobs against the controller at ``address``; samples every 50 ms."""
    jobs = [_Job(spec) for spec in scenario.jobs]
    stop = threading.Event()
    t0 = time.monotonic()
    threads = [
        threading.Thread(
            target=_run_job, args=(address, job, t0, scale, scenario.duration, stop), daemon=True
        )
        for job in jobs
    ]
    for t in threads:
        t.start()
    times: list[float] = []
    moved: list[dict[str, int]] = []
    end = t0 + scenario.duration * scale
    next_at = t0
    try:
        while True:
            now = time.monotonic()
            times.append(now - t0)
            moved.append({job.spec.job_id: job.moved for job in jobs})
            if now >= end:
                break
            next_at += SAMPLE
            stop.wait(max(0.0, min(next_at, end) - time.monotonic()))  # the sampling clock
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    errors = {j.spec.job_id: [repr(e) for e in j.errors] for j in jobs if j.errors}
    return Run(scenario, scale, times, moved, errors)


def controller_args(policy: str) -> list[str]:
    return [
        "--policy",
        policy,
        "--capacity",
        str(CAPACITY),
        "--node-bandwidth",
        str(NODE_BANDWIDTH),
    ]


def plot(run: Run, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    ts = run.times
    step = max(1, round(0.25 / SAMPLE))  # 250 ms bins
    for job in run.moved[0]:
        xs, ys = [], []
        for k in range(step, len(ts), step):
            xs.append(ts[k])
            ys.append((run.moved[k][job] - run.moved[k - step][job]) / (ts[k] - ts[k - step]) / MiB)
        ax.plot(xs, ys, label=job)
    ax.set_xlabel("seconds")
    ax.set_ylabel("MiB/s")
    ax.set_title(f"{run.scenario.name} ({run.scenario.policy}), B = {CAPACITY / MiB:.0f} MiB/s")
    ax.legend(ncol=4, fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", nargs="+", choices=sorted(SCENARIOS), default=list(SCENARIOS))
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every time by this")
    parser.add_argument("--plot-dir", type=Path, help="write <scenario>.png here")
    args = parser.parse_args(argv)
    results = []
    for name in args.scenario:
        scenario = SCENARIOS[name]
        with tempfile.TemporaryDirectory() as state:
            proc, address, _log = start_controller(state, controller_args(scenario.policy))
            try:
                run = run_scenario(scenario, address, args.scale)
            finally:
                proc.terminate()
                proc.wait(10)
        results.append(run.summary())
        if args.plot_dir is not None:
            args.plot_dir.mkdir(parents=True, exist_ok=True)
            plot(run, args.plot_dir / f"{name}.png")
    json.dump(
        {"benchmark": "fairness", "scale": args.scale, "scenarios": results}, sys.stdout, indent=2
    )
    print()


if __name__ == "__main__":
    main()
