"""Many sessions on R replicas: what the clients get against capacity, who attaches, what it costs.

Starts R replicas (``burstctl controller`` processes on fixed loopback ports, each the others'
peer, each with its own capacity ``--capacity``, ``--node-bandwidth``, policy ``--policy``;
``max_sessions`` and ``max_sessions_per_client`` raised above the run's sessions and
``shed_loop_lag`` 0, so nothing is refused unless a limit is asked for) and W load-generator
processes (``bench/scale_node.py``) acting as compute nodes: each holds one gRPC channel and
one Node stream per replica and runs its share of the sessions on them, as a `ClientRuntime`
does (``--session-streams``: one Session stream per session instead, the protocol before Node
streams).

Jobs are placed (seeded) until there are ``--sessions`` sessions: each job has
``--sessions-per-job`` nodes (Hello ``nodes``); ``--multi`` of the jobs (20 %) are on 2–3
replicas, the others on the least loaded one. Every node of a job holds one session on each
of the job's replicas (as a striped `Session` holds one stream per replica), all in the same
generator; the nodes are dealt round robin over the generators. Each session acquires
``--chunk`` bytes every ``--period`` seconds (256 KiB / 100 ms: 2.5 MiB/s, so 410 sessions
want a replica's 1 GiB/s). Nodes start over ``--ramp`` seconds in a seeded order; then
``--seconds`` are measured. ``--raw``: sessions speak the protocol themselves (a lighter
generator, strict fallback 0; ``scale_node.py``). With ``--replicas 1`` and
``--max-sessions``, ``--max-sessions-per-client``, ``--shed-loop-lag`` it measures one
controller shedding load: attached, within capacity, or refused with a retry hint, never
loose.

Prints one JSON object. Per replica (``replicas``):

- ``ratio``: the bytes its clients were granted in each 1 s window of the measured part
  (windows every 0.5 s), against its capacity: ``max``, ``mean``, ``over_1_05`` (windows over
  1.05 B) and the series; ``demand`` (what its sessions want, against capacity);
  ``in_force_max`` (``--raw``: the rates in force, summed, against capacity);
- ``sessions``, ``attached_end``, ``attached_min`` (in the measured part),
  ``never_attached``, ``attach_s_p50`` / ``p99`` (from a session's start to its first
  allocation), ``unthrottled_max`` (most sessions at once running without a limit);
- ``jain``: Jain's index of the bytes per node of its single-replica jobs (a multi-replica
  job's slice here is the split's, not an equal share);
- ``cpu_cores`` (all threads, over the measured part), ``cpu_cores_per_1000_sessions``,
  ``rss_mib`` (max), and from the controller's own stats (the ``stats:`` line it logs when
  it stops; its counters run from its start, ramp included): ``decision_p50_s`` /
  ``p99_s`` (its last 100,000 decisions), ``messages``, ``messages_per_session_s``
  (messages over the sessions' lifetimes), ``pushes``, ``renewals``, refusals, loop lag
  peak, and ``sync`` (exchanges, failed sends); ``heartbeat_closures`` from its log;
- ``profile`` (``--profile``): each controller runs under cProfile (its event-loop thread,
  from its start to its stop: gRPC's own threads are C); ``busy_s`` (profiled time less the
  loop's idle wait), the top functions by own time, the burstctl ones by cumulative time,
  and the busy time per message and per session per second. The profiler slows the Python
  code: read the shares, not the CPU figures, of a profiled run.

Over the run (``total``): the same attach figures, the per-node rate of multi-replica jobs
against single-replica ones (``multi_vs_single_per_node`` mean and max; 1.0 is fair when
every job wants more than its share: below that a multi-replica node wants 2–3× as much,
``demand_multi_vs_single``), the clients' counters (lease expiries, attach timeouts,
refusals, stream ends by code). Per generator: its CPU (cores, its own count over the
measured part) and loop lag, so a reader sees what bounds the run; ``bound`` names what ran
at 85 % of a core or more.

Everything started is stopped by pid; the run has a deadline.

    python bench/scale.py [--replicas 2] [--sessions 1000] [--generators 2] [--seconds 20]
        [--ramp 10] [--raw] [--session-streams] [--profile] [--max-sessions N]
        [--shed-loop-lag S]
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import random
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from scale_node import SAMPLE

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support import ControllerProcess, clean_env, free_port

MiB = 1 << 20
ROOT = Path(__file__).resolve().parents[1]
NODE = ROOT / "bench" / "scale_node.py"
LATE = 60.0  # s past the run's end before a generator is killed
# The packages whose functions the profile lists by cumulative time (not the CLI's wrappers).
PRODUCT = ("controller/", "policies/", "common/", "proto/")
_STATS = re.compile(r"stopped; stats: (\{.*\})")


@dataclass(frozen=True)
class Job:
    job_id: str
    nodes: int
    replicas: tuple[int, ...]


def plan(args: argparse.Namespace) -> tuple[list[Job], list[list[list[Any]]]]:
    """The jobs, and each generator's sessions ``[job_id, user, nodes, replica, start_s]``."""
    rng = random.Random(args.seed)
    k, r = args.sessions_per_job, args.replicas
    load = [0] * r
    jobs: list[Job] = []
    count = 0
    while count < args.sessions:
        if r >= 2 and rng.random() < args.multi:
            where = tuple(sorted(rng.sample(range(r), rng.randint(2, min(3, r)))))
        else:
            where = (min(range(r), key=load.__getitem__),)
        for i in where:
            load[i] += k
        jobs.append(Job(f"job-{len(jobs)}", k, where))
        count += k * len(where)
    nodes = [(job, n) for job in jobs for n in range(k)]
    rng.shuffle(nodes)
    per: list[list[list[Any]]] = [[] for _ in range(args.generators)]
    for rank, (job, _) in enumerate(nodes):
        start = args.ramp * rank / len(nodes)
        user = f"user{int(job.job_id[4:]) % 100}"
        for i in job.replicas:
            per[rank % args.generators].append([job.job_id, user, job.nodes, i, start])
    return jobs, per


def start_replicas(args: argparse.Namespace, tmp: Path, started: list[ControllerProcess]) -> None:
    """Every replica started, appended to ``started`` at once so that a failure stops them."""
    ports: list[int] = []
    while len(ports) < args.replicas:  # distinct: the replicas need each other's before they start
        if (port := free_port()) not in ports:
            ports.append(port)
    limit = str(max(4 * args.sessions, 10_000))
    for i, port in enumerate(ports):
        env = {
            "BURSTCTL_CAPACITY": args.capacity,
            "BURSTCTL_NODE_BANDWIDTH": args.node_bandwidth,
            "BURSTCTL_POLICY": args.policy,
            "BURSTCTL_REPLICA_ID": f"r{i}",
            "BURSTCTL_PEERS": ",".join(f"127.0.0.1:{p}" for p in ports if p != port),
            "BURSTCTL_LOG_LEVEL": "INFO",
            "BURSTCTL_HEARTBEAT_TIMEOUT": str(args.heartbeat_timeout),
            "BURSTCTL_MAX_SESSIONS": str(args.max_sessions or limit),
            "BURSTCTL_MAX_SESSIONS_PER_CLIENT": str(args.max_sessions_per_client or limit),
            "BURSTCTL_SHED_LOOP_LAG": str(args.shed_loop_lag),
            "GRPC_VERBOSITY": "ERROR",
        }
        profile = ["-m", "cProfile", "-o", str(tmp / f"r{i}.prof")] if args.profile else []
        ctl = ControllerProcess(
            tmp / f"r{i}", address=f"127.0.0.1:{port}", env=env, python_args=profile
        )
        started.append(ctl)
        ctl.start(timeout=60)


def cpu_of(procs: list[psutil.Process]) -> list[float]:
    out = []
    for p in procs:
        try:
            t = p.cpu_times()
            out.append(t.user + t.system)
        except psutil.Error:  # exited early: no figure
            out.append(float("nan"))
    return out


def run(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    jobs, per = plan(args)
    replicas: list[ControllerProcess] = []
    gens: list[subprocess.Popen[bytes]] = []
    load0 = os.getloadavg()[0]
    try:
        start_replicas(args, tmp, replicas)
        targets = [c.address for c in replicas]
        t0 = time.time() + 2.0
        for g, sessions in enumerate(per):
            spec = {
                "targets": targets,
                "sessions": sessions,
                "t0": t0,
                "ramp": args.ramp,
                "seconds": args.seconds,
                "chunk": args.chunk,
                "period": args.period,
                "fallback": args.fallback,
                "attach_timeout": args.attach_timeout,
                "raw": args.raw,
                "node_streams": not args.session_streams,
                "out": str(tmp / f"g{g}.json"),
            }
            err = open(tmp / f"g{g}.log", "wb")  # noqa: SIM115 - the child's stderr
            proc = subprocess.Popen(
                [sys.executable, str(NODE)],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=err,
                env={**clean_env(), "GRPC_VERBOSITY": "ERROR"},
            )
            err.close()
            gens.append(proc)
            assert proc.stdin is not None
            proc.stdin.write(json.dumps(spec).encode())
            proc.stdin.close()
        rep_ps = [psutil.Process(c.proc.pid) for c in replicas if c.proc is not None]
        begin, end = t0 + args.ramp, t0 + args.ramp + args.seconds
        rss = [0] * len(rep_ps)
        marks: list[tuple[float, list[float]]] = []  # the replicas' CPU at begin and end
        while time.time() < end + LATE and (len(marks) < 2 or any(p.poll() is None for p in gens)):
            now = time.time()
            if len(marks) < 2 and now >= (begin, end)[len(marks)]:
                marks.append((now, cpu_of(rep_ps)))
            for i, p in enumerate(rep_ps):
                rss[i] = max(rss[i], p.memory_info().rss)
            time.sleep(0.1)  # sampling the processes, not synchronisation
        load1 = os.getloadavg()[0]
    finally:
        for p in gens:
            if p.poll() is None:
                p.kill()
            p.wait()
        for c in replicas:
            c.stop(timeout=60)
    results = []
    for g, p in enumerate(gens):
        path = tmp / f"g{g}.json"
        if p.returncode != 0 or not path.exists():
            log = (tmp / f"g{g}.log").read_text(errors="replace")[-3000:]
            raise SystemExit(f"generator {g} failed ({p.returncode}):\n{log}")
        results.append(json.loads(path.read_text()))
    if len(marks) < 2:
        raise SystemExit("the run ended before its measured part did")
    (w0, rc0), (w1, rc1) = marks
    replica_cpu = [(b - a) / (w1 - w0) for a, b in zip(rc0, rc1, strict=True)]
    gen_cpu = [r["cpu_cores"] for r in results]
    stats = [stats_of(c) for c in replicas]
    for st, c in zip(stats, replicas, strict=True):
        st["heartbeat_closures"] = "".join(c.log).count("no heartbeat for")
    profiles = [profile_of(tmp / f"r{i}.prof") for i in range(len(replicas))]
    return summarise(
        args, jobs, per, results, replica_cpu, gen_cpu, rss, stats, profiles, (load0, load1)
    )


def stats_of(ctl: ControllerProcess) -> dict[str, Any]:
    m = _STATS.search("".join(ctl.log))
    return json.loads(m.group(1)) if m else {}


def profile_of(path: Path, top: int = 15) -> dict[str, Any] | None:
    """One controller's cProfile (None: not profiled): the top functions by own time and the
    product's functions (``PRODUCT``) by cumulative time. cProfile times the wall clock: the
    loop's wait in ``epoll.poll`` is idle, not work, and is left out of ``busy_s`` and the
    shares (a cumulative time that includes the wait can exceed 1)."""
    if not path.exists():
        return None
    st = pstats.Stats(str(path))
    rows = []
    idle = 0.0
    for (file, line, name), (_, calls, tt, ct, _) in st.stats.items():  # type: ignore[attr-defined]
        if "select.epoll" in name:
            idle += tt
            continue
        where = short(file)
        rows.append((tt, ct, calls, f"{where}:{line}({name})", where.startswith(PRODUCT)))
    busy = float(st.total_tt) - idle  # type: ignore[attr-defined]

    def entry(tt: float, ct: float, calls: int, where: str) -> dict[str, Any]:
        return {
            "function": where,
            "own_s": round(tt, 3),
            "own_share": round(tt / busy, 3),
            "cumulative_s": round(ct, 3),
            "cumulative_share": round(ct / busy, 3),
            "calls": calls,
        }

    by_own = sorted(rows, reverse=True)[:top]
    ours = sorted((r for r in rows if r[4]), key=lambda r: r[1], reverse=True)[:top]
    return {
        "busy_s": round(busy, 2),
        "idle_s": round(idle, 2),
        "top_own_time": [entry(*r[:4]) for r in by_own],
        "top_cumulative_product": [entry(*r[:4]) for r in ours],
    }


def short(file: str) -> str:
    """A profiled file's path from the repository or the library root."""
    if file.startswith(str(ROOT)):
        return file[len(str(ROOT)) + 1 :]
    return re.split(r"site-packages/|/lib/python3\.\d+/", file)[-1]


def pct(values: list[float], q: float) -> float | None:
    s = sorted(values)
    return round(s[min(len(s) - 1, int(q * len(s)))], 3) if s else None


def jain(xs: list[float]) -> float | None:
    sq = sum(x * x for x in xs)
    return round(sum(xs) ** 2 / (len(xs) * sq), 4) if xs and sq > 0 else None


def summarise(
    args: argparse.Namespace,
    jobs: list[Job],
    per: list[list[list[Any]]],
    results: list[dict[str, Any]],
    replica_cpu: list[float],
    gen_cpu: list[float],
    rss: list[int],
    stats: list[dict[str, Any]],
    profiles: list[dict[str, Any] | None],
    load: tuple[float, float],
) -> dict[str, Any]:
    from burstctl.common.units import parse_rate

    capacity = parse_rate(args.capacity)
    want = args.chunk / args.period
    r_count = args.replicas
    # Per replica and sample: started, attached, unthrottled, moved, in force (all generators).
    ks = min(len(r["samples"]) for r in results)
    sums = [
        [[sum(r["samples"][k][i][f] for r in results) for f in range(5)] for i in range(r_count)]
        for k in range(ks)
    ]
    first_k = round((args.ramp + 1.0) / SAMPLE)  # the first 1 s window inside the measure
    last_k = min(ks - 1, round((args.ramp + args.seconds) / SAMPLE))
    steady = range(first_k, last_k + 1)
    sessions = [s for sess in per for s in sess]
    attach = [a for r in results for a in r["attach_s"]]
    window = [b for r in results for b in r["window_bytes"]]
    live_s = [args.ramp + args.seconds - s[4] for s in sessions]
    counts: Counter[str] = Counter()
    for r in results:
        counts.update(r["counts"])

    # Bytes per node of each job over the measured part: at each replica, and in all.
    at: dict[tuple[str, int], float] = Counter()
    for s, b in zip(sessions, window, strict=True):
        at[(s[0], s[3])] += b
    per_node = {j.job_id: sum(at[(j.job_id, i)] for i in j.replicas) / j.nodes for j in jobs}
    single = [per_node[j.job_id] for j in jobs if len(j.replicas) == 1]
    multi = [per_node[j.job_id] for j in jobs if len(j.replicas) > 1]
    single_mean = sum(single) / len(single) if single else 0.0

    out_replicas = []
    for i in range(r_count):
        mine = [n for n, s in enumerate(sessions) if s[3] == i]
        ratios = [(sums[k][i][3] - sums[k - 2][i][3]) / (2 * SAMPLE) / capacity for k in steady]
        lat = [attach[n] for n in mine if attach[n] is not None]
        st = stats[i]
        sync = st.get("sync", {})
        row: dict[str, Any] = {
            "replica": f"r{i}",
            "sessions": len(mine),
            "jobs": sum(i in j.replicas for j in jobs),
            "demand": round(len(mine) * want / capacity, 3),
            "ratio": {
                "max": round(max(ratios), 3) if ratios else None,
                "mean": round(sum(ratios) / len(ratios), 3) if ratios else None,
                "over_1_05": sum(x > 1.05 for x in ratios),
                "windows": [round(x, 3) for x in ratios],
            },
            "in_force_max": round(max(sums[k][i][4] for k in steady) / capacity, 3)
            if args.raw and ratios
            else None,
            "attached_end": int(sums[last_k][i][1]),
            "attached_min": int(min(sums[k][i][1] for k in steady)) if ratios else None,
            "never_attached": len(mine) - len(lat),
            "attach_s_p50": pct(lat, 0.5),
            "attach_s_p99": pct(lat, 0.99),
            "unthrottled_max": int(max(sums[k][i][2] for k in range(ks))),
            "jain": jain([at[(j.job_id, i)] / j.nodes for j in jobs if j.replicas == (i,)]),
            "cpu_cores": round(replica_cpu[i], 3),
            "cpu_cores_per_1000_sessions": round(1000 * replica_cpu[i] / len(mine), 3)
            if mine
            else None,
            "rss_mib": round(rss[i] / MiB, 1),
            "decision_p50_s": st.get("decision_p50_s"),
            "decision_p99_s": st.get("decision_p99_s"),
            "decisions": st.get("decisions"),
            "messages": st.get("messages"),
            "messages_per_session_s": round(st["messages"] / sum(live_s[n] for n in mine), 2)
            if "messages" in st and mine
            else None,
            "pushes": st.get("pushes"),
            "renewals": st.get("renewals"),
            "refused_sessions": st.get("refused_sessions"),
            "rejected_sessions": st.get("rejected_sessions"),
            "heartbeat_closures": st.get("heartbeat_closures"),
            "loop_lag_peak_s": st.get("loop_lag_peak_s"),
            "sync": {
                "exchanges": sync.get("exchanges"),
                "failed_sends": sum(link.get("failures", 0) for link in sync.get("links", [])),
                "digests_received": sync.get("digests_received"),
            }
            if sync
            else None,
        }
        prof = profiles[i]
        if prof is not None and st.get("messages"):
            prof["busy_us_per_message"] = round(1e6 * prof["busy_s"] / st["messages"], 1)
            prof["busy_ms_per_session_s"] = round(
                1e3 * prof["busy_s"] / sum(live_s[n] for n in mine), 3
            )
        row["profile"] = prof
        out_replicas.append(row)

    lat_all = [a for a in attach if a is not None]
    generators = [
        {
            "sessions": len(per[g]),
            "cpu_cores": round(gen_cpu[g], 3),
            "loop_lag_max_s": round(results[g]["loop_lag_max"], 3),
        }
        for g in range(len(per))
    ]
    busy = [f"r{i}" for i, c in enumerate(replica_cpu) if c >= 0.85]
    busy += [f"g{g}" for g, c in enumerate(gen_cpu) if c >= 0.85]
    multi_jobs = [j for j in jobs if len(j.replicas) > 1]
    return {
        "benchmark": "scale",
        "replicas_n": r_count,
        "sessions": len(sessions),
        "jobs": len(jobs),
        "multi_replica_jobs": len(multi_jobs),
        "sessions_per_job": args.sessions_per_job,
        "generators_n": args.generators,
        "raw": args.raw,
        "streams": "session" if args.raw or args.session_streams else "node",
        "fallback": None if args.raw else args.fallback,
        "policy": args.policy,
        "capacity": args.capacity,
        "node_bandwidth": args.node_bandwidth,
        "chunk": args.chunk,
        "period": args.period,
        "ramp_s": args.ramp,
        "seconds": args.seconds,
        "profiled": args.profile,
        "cpu_count": os.cpu_count(),
        "load_average_1m": [round(load[0], 2), round(load[1], 2)],
        "replicas": out_replicas,
        "generators": generators,
        "bound": busy or None,
        "total": {
            "attached_end": sum(r["attached_end"] for r in out_replicas),
            "never_attached": sum(r["never_attached"] for r in out_replicas),
            "attach_s_p50": pct(lat_all, 0.5),
            "attach_s_p99": pct(lat_all, 0.99),
            "ratio_max": max((r["ratio"]["max"] or 0.0) for r in out_replicas),
            "over_1_05": sum(r["ratio"]["over_1_05"] for r in out_replicas),
            "multi_vs_single_per_node": {
                "mean": round(sum(multi) / len(multi) / single_mean, 3)
                if multi and single_mean
                else None,
                "max": round(max(multi) / single_mean, 3) if multi and single_mean else None,
            },
            "demand_multi_vs_single": round(
                sum(len(j.replicas) for j in multi_jobs) / len(multi_jobs), 2
            )
            if multi_jobs
            else None,
            "lease_expiries": counts["lease_expiries"],
            "attach_timeouts": counts["attach_timeouts"],
            "refusals": counts["refusals"],
            "close_timeouts": counts["close_timeouts"],
            "stream_ends": {k[6:]: v for k, v in sorted(counts.items()) if k.startswith("ended_")},
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, default=2, help="controller processes")
    parser.add_argument("--sessions", type=int, default=1000, help="in all (streams)")
    parser.add_argument("--generators", type=int, default=2, help="load-generator processes")
    parser.add_argument("--sessions-per-job", type=int, default=1, help="nodes of each job")
    parser.add_argument("--multi", type=float, default=0.2, help="jobs on 2-3 replicas")
    parser.add_argument("--seconds", type=float, default=20.0, help="measured after the ramp")
    parser.add_argument("--ramp", type=float, default=10.0, help="s over which sessions start")
    parser.add_argument("--chunk", type=int, default=256 * 1024, help="bytes per acquire")
    parser.add_argument("--period", type=float, default=0.1, help="s between acquires")
    parser.add_argument("--capacity", default="1GiB/s", help="B of each replica")
    parser.add_argument("--node-bandwidth", default="64MiB/s")
    parser.add_argument("--policy", default="size-fair")
    parser.add_argument("--heartbeat-timeout", type=float, default=3.0)
    parser.add_argument("--attach-timeout", type=float, default=2.0)
    parser.add_argument("--fallback", default="keep-last")
    parser.add_argument("--max-sessions", type=int, default=None, help="default: raised")
    parser.add_argument("--max-sessions-per-client", type=int, default=None, help="default: raised")
    parser.add_argument("--shed-loop-lag", type=float, default=0.0, help="0 = never shed")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--raw", action="store_true", help="sessions speak the protocol themselves (light load)"
    )
    parser.add_argument(
        "--session-streams",
        action="store_true",
        help="client-runtime sessions on one Session stream each (the protocol before Node "
        "streams), not one Node stream per generator and replica",
    )
    parser.add_argument("--profile", action="store_true", help="each controller under cProfile")
    args = parser.parse_args()
    if args.replicas < 1 or args.generators < 1 or args.sessions < 1:
        parser.error("--replicas, --generators and --sessions must be at least 1")
    with tempfile.TemporaryDirectory(prefix="burstctl-scale-") as tmp:
        print(json.dumps(run(args, Path(tmp)), indent=2))


if __name__ == "__main__":
    main()
