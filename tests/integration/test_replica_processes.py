"""Replicas as separate ``burstctl controller --peers ...`` processes (docs/replicas.md).

A replica killed by pid leaves the survivors' global view within k·λ and comes
back when restarted; a policy switched on one replica through the admin CLI
reaches the others with the next exchange.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack

import httpx
import pytest
from support import ControllerProcess, Pump, wait_until
from support import run_burstctl as burstctl
from test_replicas import MiB, free_port, job

from burstctl.client import JobInfo, Session

pytestmark = pytest.mark.integration
LAMBDA = 0.2
MISSED = 3
Factory = Callable[..., ControllerProcess]


def replicas(
    make: Factory,
    capacities: list[int],
    policy: str = "size-fair",
    env: dict[str, str] | None = None,
) -> list[ControllerProcess]:
    ports = [free_port() for _ in capacities]
    out = []
    for i, cap in enumerate(capacities):
        peers = ",".join(f"127.0.0.1:{p}" for j, p in enumerate(ports) if j != i)
        out.append(
            make(
                "--replica-id",
                f"r{i + 1}",
                "--peers",
                peers,
                "--sync-interval",
                str(LAMBDA),
                "--missed-exchanges",
                str(MISSED),
                "--capacity",
                f"{cap}MiB/s",
                "--node-bandwidth",
                "8MiB/s",
                "--policy",
                policy,
                address=f"127.0.0.1:{ports[i]}",
                env=env,
            )
        )
    return out


def rates_are(sessions: dict[str, Session], expected: dict[str, float]) -> bool:
    """Every named session holds a live allocation of ``expected`` MiB/s (±2 %)."""
    return all(
        sessions[n].attached and abs(sessions[n].rate - r * MiB) <= 0.02 * r * MiB + 1
        for n, r in expected.items()
    )


def waited(predicate: Callable[[], bool], timeout: float, message: str) -> float:
    t0 = time.monotonic()
    wait_until(predicate, timeout, interval=0.005, message=message)
    return time.monotonic() - t0


@pytest.fixture
def flat_out() -> Iterator[Callable[[str, ControllerProcess, JobInfo], Session]]:
    """Opens sessions that move bytes as fast as they are allowed; all closed at the end."""
    with ExitStack() as stack:

        def open_session(name: str, replica: ControllerProcess, info: JobInfo) -> Session:
            assert replica.address is not None
            s = Session(replica.address, info)
            stack.callback(s.close)
            pump = Pump(s).start()
            stack.callback(pump.stop)
            pumps[name] = pump
            return s

        pumps: dict[str, Pump] = {}
        yield open_session
        assert not any(p.errors for p in pumps.values())


def test_killed_replica_leaves_the_global_view_and_rejoins(
    controller_factory: Factory, flat_out: Callable[[str, ControllerProcess, JobInfo], Session]
) -> None:
    lease, grace = 1.5, 1.0
    env = {"BURSTCTL_LEASE": str(lease), "BURSTCTL_FALLBACK_GRACE": str(grace)}
    r1, r2 = replicas(controller_factory, [40, 40], env=env)
    sessions = {
        "J1@r1": flat_out("J1@r1", r1, job("J1", 16)),
        "J2": flat_out("J2", r1, job("J2", 8)),
        "J1@r2": flat_out("J1@r2", r2, job("J1", 16)),
        "J3": flat_out("J3", r2, job("J3", 8)),
    }
    synced = {"J1@r1": 20.0, "J2": 20.0, "J1@r2": 20.0, "J3": 20.0}
    waited(lambda: rates_are(sessions, synced), 15, "global fairness")

    r2.stop(signal.SIGKILL)  # by pid
    assert r1.url is not None

    def r2_live() -> bool:
        peers = httpx.get(f"{r1.url}/v1/replicas", timeout=5).json()["peers"]
        return any(p["replica_id"] == "r2" and p["live"] for p in peers)

    # R2 leaves the view once silent for more than k·λ; R1 checks after each exchange (λ).
    left = waited(lambda: not r2_live(), 10, "R2 out of R1's view")
    assert left <= (MISSED + 1) * LAMBDA + 0.5, left
    # R1 alone: J1 has 16 of the 24 nodes it sees, 2/3 of its 40 MiB/s. Not before the
    # rates R2 pushed have surely been let go (λ + lease + fallback_grace + λ after its
    # last digest): until then R2's sessions may still hold them, and R1 keeps counting them.
    alone = {"J1@r1": 80 / 3, "J2": 40 / 3}
    dropped = left + waited(lambda: rates_are(sessions, alone), 10, "R1 deciding alone")
    assert lease + grace <= dropped <= lease + grace + (MISSED + 3) * LAMBDA + 0.5, dropped

    r2.start()  # same port, same state directory, a new incarnation
    reattached = waited(
        lambda: sessions["J1@r2"].attached and sessions["J3"].attached, 15, "R2's sessions back"
    )
    back = waited(lambda: rates_are(sessions, synced), 10, "global fairness again")
    print(
        f"R2 killed: out of the view after {left:.2f}s (k·λ = {MISSED * LAMBDA:.1f}s), "
        f"R1 alone after {dropped:.2f}s (lease {lease}s); "
        f"restarted: sessions back after {reattached:.2f}s, fair again {back:.3f}s later"
    )
    assert back <= 2 * LAMBDA + 0.3, back


def test_policy_switch_on_one_replica_reaches_all_within_two_lambda(
    controller_factory: Factory,
) -> None:
    r1, r2, r3 = replicas(controller_factory, [40, 20, 20])

    def policy_of(r: ControllerProcess) -> dict[str, object]:
        assert r.url is not None
        return dict(httpx.get(r.url + "/v1/policy", timeout=5).json())

    # the replicas know each other before the switch (each has heard from both peers)
    for r in (r1, r2, r3):
        assert r.url is not None
        wait_until(
            lambda r=r: (
                sum(p["live"] for p in httpx.get(r.url + "/v1/replicas").json()["peers"]) == 2
            ),
            10,
            message="peers live",
        )
    token = ["--url", str(r1.url), "--token-file", str(r1.state_dir / "admin-token")]
    bad = burstctl("policy", "set", "fastest", *token)
    assert bad.returncode != 0 and "name: unknown policy 'fastest'" in bad.stderr
    unauthorised = burstctl("policy", "set", "fcfs", "--url", str(r1.url))
    assert unauthorised.returncode != 0 and "bearer token" in unauthorised.stderr

    done = burstctl("policy", "set", "periodic-greedy-yield", "--param", "delta=0.5", *token)
    switched = time.monotonic()
    assert done.returncode == 0, done.stderr
    assert "periodic-greedy-yield active (version 1)" in done.stdout

    def everywhere() -> bool:
        return all(
            (p := policy_of(r))["name"] == "periodic-greedy-yield"
            and p["params"] == {"delta": 0.5}
            and p["version"] == 1
            for r in (r2, r3)
        )

    wait_until(everywhere, 10, interval=0.01, message="the switch on every replica")
    took = time.monotonic() - switched
    print(f"policy switch on r1 reached r2 and r3 after {took:.3f}s (2λ = {2 * LAMBDA}s)")
    assert took <= 2 * LAMBDA + 0.2
    shown = burstctl("policy", "get", "--url", str(r3.url), "--json")
    assert json.loads(shown.stdout)["name"] == "periodic-greedy-yield"
    # the replica that adopted it persisted it ...
    saved = json.loads((r3.state_dir / "state.json").read_text())["policy"]
    assert (saved["name"], saved["params"], saved["version"]) == (
        "periodic-greedy-yield",
        {"delta": 0.5},
        1,
    )
    # ... and, restarted with the same configuration, still holds it (saved, and
    # in its peers' digests)
    r3.stop()
    r3.start()
    wait_until(
        lambda: policy_of(r3)["name"] == "periodic-greedy-yield", 2 * LAMBDA + 1, 0.01, "adopted"
    )
