"""``persched`` across three replicas: one pattern for the whole system, each replica its part.

Three replica processes of 20 MiB/s (λ = 0.2 s, b = 8 MiB/s, reserve 0.1), each the others'
peer on loopback gRPC. Three periodic jobs are each on two replicas (a session on each, each
moving half the job's bytes per iteration) and a non-periodic job pumps on one. Every replica
computes the pattern from the merged digests, r1 (the lowest id) announces its origin, and
every replica paces its sessions to its part of each window (docs/replicas.md, "PerSched
across replicas"). The pattern is PERSCHED's on the whole system (capacity Σ B_r), which the
test computes too (``compute`` is deterministic). Per session: ≤ 1 % of the bytes outside its
windows, the iteration time within 5 % of the pattern's; the non-periodic job gets the
reserve, and what the windows leave on its replica.

The replicas are processes so that the clients' threads (in this process) and the three
controllers do not share one interpreter lock: a periodic client whose pattern leaves it no
slack must start its I/O when its window opens.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from support import ControllerProcess, free_port, wait_until
from support.periodic import CHUNK, Trace, paced, periodic_loop, pump

from burstctl.client import JobInfo, Session
from burstctl.policies.persched.live import Installed, PerSchedParams, compute

pytestmark = pytest.mark.integration

MiB = 1 << 20
LAMBDA = 0.2
RESERVE = 0.1
CAPACITY = 20 * MiB
# (name, nodes, w s, vol_io bytes of the whole job per iteration, its two replicas)
PERIODIC = [
    ("p1", 2, 0.2, 3 * MiB, (0, 1)),
    ("p2", 2, 0.3, 4 * MiB, (1, 2)),
    ("p3", 1, 0.25, 1 * MiB, (2, 0)),
]


# Each window carries 10 % more than an iteration's bytes: a client whose compute phase ends
# when its window opens (PERSCHED packs one job so) and whose thread wakes a few ms late
# still moves its bytes in that window ("headroom", docs/persched.md).
PARAMS = {"reserve": RESERVE, "kprime": 2, "headroom": 0.1}


def three_replicas(make: Any, tmp_path: Path) -> list[ControllerProcess]:
    """The three replicas, each told the others' addresses before it starts. A port chosen
    free may be taken meanwhile (by any process's outgoing connection): then all three are
    started again on new ports."""
    for attempt in range(3):
        ports = [free_port() for _ in range(3)]
        out = []
        for i in range(3):
            peers = ", ".join(f'"127.0.0.1:{p}"' for j, p in enumerate(ports) if j != i)
            config = tmp_path / f"r{i + 1}-{attempt}.toml"
            config.write_text(
                f'replica_id = "r{i + 1}"\npolicy = "persched"\ncapacity = "20MiB/s"\n'
                f'node_bandwidth = "8MiB/s"\nsync_interval = {LAMBDA}\npeers = [{peers}]\n'
                "[policy_params]\n" + "".join(f"{k} = {v}\n" for k, v in PARAMS.items())
            )
            state = tmp_path / f"state-r{i + 1}-{attempt}"
            out.append(
                make("--config", str(config), address=f"127.0.0.1:{ports[i]}", state_dir=state)
            )
            if out[-1].address is None:  # it exited: its port was taken
                break
        else:
            return out
        for started in out:
            started.stop()
    raise AssertionError("three replicas did not start on free ports: " + "".join(out[-1].log))


def pattern_of(jobs: list[tuple[str, int, float, float]]) -> Installed:
    """PERSCHED's pattern of ``jobs`` (name, nodes, w, vol_io) on the whole system, as every
    replica computes it from the merged digests."""
    key = (tuple(sorted(jobs)), 3.0 * CAPACITY, 8.0 * MiB)
    computed = compute(key, PerSchedParams(**PARAMS))
    assert computed.result is not None
    return Installed(computed, 0.0, computed.schedules)


def learned_pattern(
    replicas: list[ControllerProcess], confident: set[tuple[str, int]]
) -> Installed | None:
    """The pattern on the periods the replicas learned, once every job is learned on both its
    replicas: as the merge takes them, w from the lowest replica id, the bytes of an
    iteration summed over the two (each replica sees its session's half). ``confident``
    gets every (job, replica index) learned by now."""
    shown = {}
    for i, r in enumerate(replicas):
        for job in httpx.get(f"{r.url}/v1/jobs", timeout=5).json():
            shown[(job["job_id"], i)] = job
            if (job.get("learned") or {}).get("confident"):
                confident.add((job["job_id"], i))
    jobs = []
    for name, nodes, _, _, placed in PERIODIC:
        learned = [(shown.get((name, r)) or {}).get("learned") for r in sorted(placed)]
        if not all(x and x["confident"] for x in learned):
            return None
        jobs.append((name, nodes, learned[0]["w"], float(sum(x["vol_io"] for x in learned))))
    return pattern_of(jobs)


# Iteration lengths within 5 %: alone, not beside other tests (as test_persched_live.py).
@pytest.mark.serial
@pytest.mark.parametrize("declared", [True, False], ids=["declared", "learned"])
def test_three_replicas_pace_each_job_to_one_pattern_and_the_other_gets_the_reserve(
    controller_factory: Any, tmp_path: Path, declared: bool
) -> None:
    """Declared: the sessions declare each job's period. Learned: they declare nothing, and
    within 10 iterations every job's learned period is within 5 % of the truth."""
    replicas = three_replicas(controller_factory, tmp_path)
    truth = pattern_of([(n, nodes, w, float(vol)) for n, nodes, w, vol, _ in PERIODIC])
    stop = threading.Event()
    runs: list[tuple[str, Session, Trace]] = []
    for name, nodes, w, vol, placed in PERIODIC:
        for r in placed:
            period_of = {"w": w, "vol_io": vol} if declared else {}
            job = JobInfo(name, "ann", "phys", nodes, **period_of)  # type: ignore[arg-type]
            address = replicas[r].address
            assert address is not None
            runs.append((name, Session(address, job), Trace()))
    assert replicas[0].address is not None and replicas[0].url is not None
    other = Session(replicas[0].address, JobInfo("np", "bob", "chem", 1))
    other_grants: list[float] = []
    workers: list[threading.Thread] = []
    try:
        by_name = {name: (w, vol) for name, _, w, vol, _ in PERIODIC}
        for name, session, trace in runs:
            w, vol = by_name[name]
            args = (session, w, vol // 2, stop, trace)
            workers.append(threading.Thread(target=periodic_loop, args=args, daemon=True))
            workers[-1].start()

        installed = truth
        learned_at: dict[str, int] = {}
        if not declared:
            found: list[Installed] = []
            sessions_at = [r for _, _, _, _, placed in PERIODIC for r in placed]

            def learned() -> bool:
                confident: set[tuple[str, int]] = set()
                pattern = learned_pattern(replicas, confident)
                for i, (name, _, trace) in enumerate(runs):  # iterations when learned there
                    if (name, sessions_at[i]) in confident:
                        learned_at.setdefault(
                            f"{name}@r{sessions_at[i] + 1}", len(trace.iterations)
                        )
                if pattern is None:
                    return False
                found[:] = [pattern]
                return True

            wait_until(learned, 60, interval=0.1, message="every job learned on its replicas")
            installed = found[0]
            for name, nodes, w, vol, _ in PERIODIC:
                (got,) = (k for k in installed.computed.key[0] if k[0] == name)
                cap = nodes * 8.0 * MiB
                assert got[2] == pytest.approx(w, rel=0.05), (name, got)
                assert got[3] == pytest.approx(vol, rel=0.05), (name, got)
                assert got[2] + got[3] / cap == pytest.approx(w + vol / cap, rel=0.05)
            assert max(learned_at.values()) <= 10, learned_at
        result = installed.computed.result
        assert result is not None
        period = result.pattern.period

        seen: list[object] = []

        def aligned() -> bool:
            """Every session paces to windows of the pattern's period, and each job's two
            sessions' windows open at the same instant (within 10 ms)."""
            for name in by_name:
                patterns = [s.pattern for n, s, _ in runs if n == name]
                seen[:] = [(name, [p and (p.period, p.origin) for p in patterns])]
                if any(p is None or abs(p.period - period) > 1e-9 for p in patterns):
                    return False
                gap = abs(patterns[0].origin - patterns[1].origin) % period  # type: ignore[union-attr]
                if min(gap, period - gap) >= 0.01:
                    return False
            return True

        try:
            wait_until(aligned, 20, message=f"one pattern of period {period:.4f} s everywhere")
        except AssertionError as exc:  # say what the sessions held
            raise AssertionError(f"{exc}; the last job checked: {seen}") from None
        workers.append(threading.Thread(target=pump, args=(other, stop, other_grants)))
        workers[-1].start()
        for attempt in range(2):
            # Steady once the origin was read from a few exchanges (the least delayed digest)
            steady = time.monotonic() + 4 * period
            wait_until(
                lambda at=steady: all(sum(s >= at for s, _ in t.iterations) >= 6 for *_, t in runs),
                30,
                message="6 steady iterations of every periodic session",
            )
            if aligned():
                break
            # Learned: a job's published period may move once by more than the estimator's
            # step (late phase boundaries on a loaded node), and the pattern with it; the
            # bounds must then hold on the new pattern from then on.
            assert not declared and not attempt, "the pattern changed while the jobs ran"
            wait_until(learned, 20, interval=0.1, message="the pattern learned again")
            installed = found[0]
            result = installed.computed.result
            assert result is not None
            period = result.pattern.period
            wait_until(aligned, 20, message="the new pattern on every replica")
        window_end = time.monotonic()
        jobs = httpx.get(f"{replicas[0].url}/v1/jobs", timeout=5).json()
        allotted = next(j["rate"] for j in jobs if j["job_id"] == "np")
        stop.set()
        for t in workers:
            t.join(10)
    finally:
        stop.set()
        for s in (*(s for _, s, _ in runs), other):
            s.close()
    report = []
    for name, _, trace in runs:
        got = paced(installed, name, trace, steady, window_end)
        report.append((name, round(got.measured, 5), round(got.predicted, 5), got.outside))
        assert got.outside <= 0.01 * got.grants, report
        assert got.measured == pytest.approx(got.predicted, rel=0.05), report
    got_np = [t for t in other_grants if steady <= t <= window_end]
    rate = len(got_np) * CHUNK / (window_end - steady)
    # The whole system's reserve is np's (its only taker), and what the windows' peak leaves
    # on r1 is lent to it: its share there, at least the reserve, at most its cap.
    reserve = RESERVE * 3 * CAPACITY
    print(f"learned at iterations {learned_at or None}; pattern period {period:.4f} s")
    print(f"(job, measured, predicted, chunks outside): {report}")
    print(f"non-periodic: {rate / MiB:.3f} MiB/s, allotted {allotted / MiB:.3f}, reserve 6")
    assert reserve <= allotted <= 8 * MiB * 1.001
    assert rate == pytest.approx(allotted, rel=0.15)
