"""Placement advice time: 1,000 jobs over 20 and 200 replicas, for each allocator.

Times the call ``GET /v1/placement`` makes (``controller/advice.py: advise_all``, which builds
the model's applications and runs ``policies/placement``'s ``advise`` with the allocator asked
for and the placement the jobs' level allows), best of ``--repeat``, on seeded synthetic jobs
with level-2 data (volume per phase, compute gap, b_j(n) measured at 1..8 replicas, the shapes
of [DIST-IO] §VI-B). Then once the whole REST round trip: one in-process replica with the
jobs registered and their profiles loaded from its state directory, ``GET /v1/placement``
timed from the client (N = 1: one replica; the advice over N replicas is the first part).
Target: under 100 ms for tcpu-allocator at 1,000 × 200. Prints JSON.

    python bench/placement_speed.py [--jobs 1000] [--replicas 20 200] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from burstctl.common.limits import ALLOCATOR_NAMES
from burstctl.controller.advice import JobInput, Resource, advise_all
from burstctl.controller.app import build_replica
from burstctl.controller.config import ControllerConfig
from burstctl.controller.profiles import PROFILES_FILE
from burstctl.policies.placement.profiles import random_profile


def synthetic_jobs(count: int, seed: int) -> list[JobInput]:
    rng = random.Random(seed)
    jobs = []
    for i in range(count):
        _, profile = random_profile(rng)
        b1 = profile(1)
        scale = 1e9 / b1  # bandwidths around 1 GB/s at one replica
        nodes = rng.choice([1, 2, 4, 8, 16, 32, 64])
        x = rng.uniform(0.0, 20.0)  # T_cpu / T_cf_io(1), as the paper's generator draws it
        volume = 5000 * 1e9 / (1 + x) / rng.randint(2, 20)
        jobs.append(
            JobInput(
                f"J{i}",
                nodes,
                volume_per_phase=volume,
                compute_seconds=volume / 1e9 * x,
                phases=rng.randint(2, 20),
                bandwidth={n: profile(n) * scale for n in range(1, profile.n_max + 1)},
            )
        )
    return jobs


def resources(n: int) -> list[Resource]:
    return [Resource(f"r{i:03d}", f"10.0.0.{i}:50051", 1e9 * (1 + i % 3)) for i in range(n)]


def time_advice(jobs: list[JobInput], n: int, allocator: str, repeat: int) -> dict[str, Any]:
    res = resources(n)
    best = float("inf")
    out = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = advise_all(res, jobs, compute_nodes=None, allocator=allocator)
        best = min(best, time.perf_counter() - t0)
    assert out is not None
    return {
        "jobs": len(jobs),
        "replicas": n,
        "allocator": allocator,
        "placement": out.placement_used,
        "seconds": round(best, 4),
        "io_load": round(out.io_load or 0.0, 4),
        "mean_count": round(sum(j.count for j in out.jobs) / len(out.jobs), 3),
    }


async def rest_round_trip(jobs: list[JobInput], allocator: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp)
        entries = [
            {
                "app": j.job_id,
                "nodes": j.nodes,
                "volume_per_phase": j.volume_per_phase,
                "compute_seconds": j.compute_seconds,
                "phases": j.phases,
                "gaps": (j.phases or 1) - 1,
                "bandwidth": {str(n): b for n, b in j.bandwidth.items()},
            }
            for j in jobs
        ]
        (state / PROFILES_FILE).write_text(json.dumps({"profiles": entries}))
        config = ControllerConfig(
            grpc_listen="127.0.0.1:0", http_listen="127.0.0.1:0", state_dir=state
        )
        replica = build_replica(config)
        await replica.start()
        try:
            token = (state / "admin-token").read_text().strip()
            async with httpx.AsyncClient(
                base_url=replica.http_url, headers={"Authorization": f"Bearer {token}"}
            ) as http:
                for j in jobs:
                    body = {"job_id": j.job_id, "user": "u", "group": "g", "nodes": j.nodes}
                    (await http.post("/v1/jobs", json={**body, "app": j.job_id})).raise_for_status()
                t0 = time.perf_counter()
                r = await http.get("/v1/placement", params={"allocator": allocator}, timeout=60)
                wall = time.perf_counter() - t0
                r.raise_for_status()
                advice = r.json()
        finally:
            await replica.stop()
    return {
        "jobs": len(advice["jobs"]),
        "replicas": len(advice["replicas"]),
        "allocator": allocator,
        "levels": sorted({j["level"] for j in advice["jobs"]}),
        "seconds": round(wall, 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--replicas", type=int, nargs="+", default=[20, 200])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    jobs = synthetic_jobs(args.jobs, args.seed)
    rows = [
        time_advice(jobs, n, allocator, args.repeat)
        for n in args.replicas
        for allocator in ALLOCATOR_NAMES
    ]
    rest = asyncio.run(rest_round_trip(jobs, "tcpu-allocator"))
    target = next(
        (r for r in rows if r["allocator"] == "tcpu-allocator" and r["replicas"] == 200), None
    )
    json.dump(
        {
            "python": sys.version.split()[0],
            "machine": platform.machine(),
            "advice": rows,
            "rest_round_trip": rest,
            "target_tcpu_1000x200_s": 0.1,
            "target_met": None if target is None else target["seconds"] < 0.1,
        },
        sys.stdout,
        indent=2,
    )
    print()


if __name__ == "__main__":
    main()
