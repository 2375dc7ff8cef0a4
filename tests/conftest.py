"""Fixtures shared by unit and integration tests."""

from __future__ import annotations

import importlib
import importlib.util
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from layering import compiled_modules, source_of
from support import ControllerProcess

from burstctl.controller.app import Replica, build_replica
from burstctl.controller.config import load_config
from burstctl.policies.registry import PolicyRegistry

# Property tests are sized by profile, not per test: `ci` for `make test` (deterministic, so a
# red run is reproducible), `thorough` for `make test-all`. HYPOTHESIS_PROFILE picks one.
settings.register_profile(
    "ci",
    max_examples=50,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.register_profile(
    "thorough",
    max_examples=1000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_sessionstart(session: pytest.Session) -> None:
    """Stops before any test when a compiled module (setup.py) is older than its source: the
    suite would test the code as it was at the last install, not as it is."""
    stale = []
    for module in compiled_modules():
        spec = importlib.util.find_spec(module)
        origin = spec.origin if spec is not None else None
        if origin is not None and not origin.endswith(".py"):
            source = source_of(module)
            if os.path.getmtime(origin) < source.stat().st_mtime:
                stale.append(str(source))
    if stale:
        pytest.exit(
            f"changed since the install compiled them: {', '.join(stale)}; rebuild with"
            " `make` (or `.venv/bin/pip install -e .`), or install with BURSTCTL_PURE_PYTHON=1",
            returncode=4,
        )


REPLICA_DEFAULTS = {
    "grpc_listen": "127.0.0.1:0",
    "http_listen": "127.0.0.1:0",
    "capacity": "40MiB/s",
    "node_bandwidth": "8MiB/s",
    "heartbeat_timeout": 1.0,
    "lease": 1.0,
}


@pytest.fixture
async def replica_factory(tmp_path: Path) -> AsyncIterator[Callable[..., Awaitable[Replica]]]:
    """Starts controller replicas in this test's event loop on OS-chosen loopback ports (with
    the built-in policies, or those of ``registry``)."""
    started: list[Replica] = []

    async def make(registry: PolicyRegistry | None = None, **overrides: object) -> Replica:
        settings = {**REPLICA_DEFAULTS, "state_dir": tmp_path / f"state{len(started)}", **overrides}
        svc = build_replica(load_config(**settings), registry)
        started.append(svc)
        await svc.start()
        return svc

    yield make
    for svc in started:
        await svc.stop(grace=0)


@pytest.fixture
async def replica(replica_factory: Callable[..., Awaitable[Replica]]) -> Replica:
    """One replica with the defaults above (B = 40 MiB/s, b = 8 MiB/s)."""
    return await replica_factory()


@pytest.fixture
def controller_factory(tmp_path: Path) -> Iterator[type[ControllerProcess]]:
    """Starts ``burstctl controller`` child processes; each is stopped by pid at teardown."""
    started: list[ControllerProcess] = []

    def make(
        *args: str,
        address: str = "127.0.0.1:0",
        env: dict[str, str] | None = None,
        state_dir: Path | None = None,
    ) -> ControllerProcess:
        proc = ControllerProcess(state_dir or tmp_path / f"state{len(started)}", args, address, env)
        started.append(proc)
        return proc.start()

    yield make  # type: ignore[misc]
    for proc in started:
        proc.stop()


@pytest.fixture
def probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An importable module on sys.path with a policy subclass inside (``<name>:Probe``):
    its name. A policy name that were an import path would import it (issue 15, finding 2)."""
    name = f"burstctl_probe_{uuid.uuid4().hex}"
    (tmp_path / f"{name}.py").write_text(
        "from burstctl.policies.fcfs import Fcfs\n\nclass Probe(Fcfs):\n    name = 'probe'\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    yield name
    sys.modules.pop(name, None)


@pytest.fixture
def busy_core() -> Iterator[None]:
    """One core kept busy by another process for the whole test (stopped by its pid)."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        spinner.kill()
        spinner.wait()
