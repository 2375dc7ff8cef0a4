"""The node agent (``burstctl agent``) against a real controller, with a Python stand-in for
the preload library (fake_library.py) in child processes: each child attaches over the
agent's socket as the library does, so the agent sees its real pid, uid and environment.

Every agent, controller and child is started here and stopped by pid. Waits are conditions
with deadlines (tests/support.py), never sleeps.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from agent_process import CLEAN, AgentProcess, agent_args
from support import ControllerProcess, jobs_of, run_burstctl, wait_until

from burstctl.preload_shim import page as layout

pytestmark = pytest.mark.integration

MiB = 1 << 20
FAKE_LIBRARY = Path(__file__).with_name("fake_library.py")
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


class Library:
    """fake_library.py in a child process with its own environment (and uid, via setpriv)."""

    def __init__(self, socket_path: Path, env: dict[str, str], as_nobody: bool = False) -> None:
        argv = [sys.executable, str(FAKE_LIBRARY), str(socket_path)]
        if as_nobody:
            # setpriv, not Popen(user=...): that forks this process, whose gRPC threads may
            # make the child crash before exec.
            argv = [*NOBODY, *argv]
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**CLEAN, **env},
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def do(self, *command: object) -> list[str]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(" ".join(map(str, command)) + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline().split()
        assert answer, f"the stand-in library died on {command}"
        return answer

    def attach(self) -> str:
        answer = self.do("attach")
        assert answer[0] == "ok", answer
        return answer[1]

    def rate(self) -> tuple[float, int, int, float]:
        _, rate, burst, flags, age = self.do("rate")
        return float(rate), int(burst), int(flags), float(age)

    def exit(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        if not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.proc.stdout.close()


def start_phase(ctl: ControllerProcess, lib: Library, job_id: str) -> None:
    """Opens the job's I/O phase and holds it open: a waiter on the page first (the agent
    holds the job's session waiting, which the controller sees as wait time), then one byte
    asked for, which posts the phase. The quiet gap never ends a phase while its job waits,
    so the controller's allocation to the job, and the page's rate, stay until `unhold`: a
    test waits on them, not on the moment before the gap ends an unheld phase."""
    lib.do("hold")
    wait_until(
        lambda: jobs_of(ctl).get(job_id, {}).get("wait_seconds", 0) > 0,
        timeout=10,
        interval=0.05,
        message=f"{job_id}'s session to wait",
    )
    lib.do("ask", 1)


@pytest.fixture
def libraries(world: Path) -> Iterator[Callable[..., Library]]:
    started: list[Library] = []

    def start(env: dict[str, str], *, as_nobody: bool = False, sock: Path | None = None) -> Library:
        lib = Library(sock or world / "run" / "burstctl" / "agent.sock", env, as_nobody)
        started.append(lib)
        return lib

    yield start
    for lib in started:
        lib.exit()


def test_attach_gives_each_job_a_page_at_its_allocation_and_books_its_bytes(
    controller_factory: Callable[..., ControllerProcess],
    agents: Callable[..., AgentProcess],
    libraries: Callable[..., Library],
    world: Path,
) -> None:
    ctl = controller_factory("--capacity", "40MiB/s", "--node-bandwidth", "8MiB/s")
    agent = agents(*agent_args(ctl, world))
    alpha = libraries({"BURSTCTL_JOB_ID": "alpha", "SLURM_NNODES": "2"})
    assert alpha.attach() == "alpha"
    # Bytes asked for post the job's I/O phase: the controller allots it a rate (fair
    # share: only jobs in I/O get one), and the page's rate becomes that allocation.
    start_phase(ctl, alpha, "alpha")
    wait_until(
        lambda: (
            jobs_of(ctl).get("alpha", {}).get("rate", 0) > 0
            and alpha.rate()[0] == pytest.approx(jobs_of(ctl)["alpha"]["rate"])
        ),
        timeout=10,
        interval=0.05,
        message="alpha's page at its allocation",
    )
    assert jobs_of(ctl)["alpha"]["nodes"] == 2  # read from the child's environment
    beta = libraries({"SLURM_JOB_ID": "4242"})
    assert beta.attach() == "4242"
    start_phase(ctl, beta, "4242")
    wait_until(
        lambda: (
            beta.rate()[0] > 0
            and beta.rate()[0] == pytest.approx(jobs_of(ctl).get("4242", {}).get("rate", -1))
            and alpha.rate()[0] == pytest.approx(jobs_of(ctl)["alpha"]["rate"])
        ),
        timeout=10,
        interval=0.05,
        message="two pages, each at its job's allocation",
    )
    status = {j["job_id"]: j for j in agent.status()["jobs"]}
    assert status["alpha"]["connections"] == [alpha.pid]
    assert status["4242"]["connections"] == [beta.pid]
    assert status["alpha"]["user"] == "root"
    # The stand-in's counters become the job's bytes at the controller.
    alpha.do("write", MiB)
    alpha.do("read", 256 * 1024)
    beta.do("write", 3 * MiB)
    wait_until(
        lambda: (
            jobs_of(ctl)["alpha"]["bytes_written"] == MiB + 1
            and jobs_of(ctl)["alpha"]["bytes_read"] == 256 * 1024
            and jobs_of(ctl)["4242"]["bytes_written"] == 3 * MiB + 1
        ),
        timeout=10,
        interval=0.05,
        message="the pages' bytes booked at the controller",
    )
    counters = agent.job("alpha")["counters"]  # type: ignore[index]
    assert counters["moved_write"] == MiB and counters["calls_write"] == 1
    # The heartbeat is fresh while the agent runs.
    assert alpha.rate()[3] < 1.0
    alpha.do("unhold")
    beta.do("unhold")
    alpha.exit()
    wait_until(lambda: agent.job("alpha")["connections"] == [], message="alpha's EOF")  # type: ignore[index]


def test_paced_writes_on_the_page_move_at_the_jobs_allocation(
    controller_factory: Callable[..., ControllerProcess],
    agents: Callable[..., AgentProcess],
    libraries: Callable[..., Library],
    world: Path,
) -> None:
    # One job alone: fair share gives it the whole 4 MiB/s.
    ctl = controller_factory("--capacity", "4MiB/s", "--node-bandwidth", "1GiB/s")
    agents(*agent_args(ctl, world))
    lib = libraries({"BURSTCTL_JOB_ID": "flat"})
    assert lib.attach() == "flat"
    start_phase(ctl, lib, "flat")  # held through the measurement: the rate stays allotted
    wait_until(lambda: lib.rate()[0] == 4 * MiB, timeout=10, interval=0.05)
    _, moved, seconds = lib.do("flat", 3, 64 * 1024)
    rate = int(moved) / float(seconds)
    # Generous: the burst at the start and a loaded 2-core machine.
    assert 0.75 * 4 * MiB < rate < 1.35 * 4 * MiB, rate / MiB
    wait_until(
        lambda: jobs_of(ctl)["flat"]["bytes_written"] == int(moved) + 1,
        timeout=10,
        interval=0.05,
        message="every byte booked",
    )
    lib.do("unhold")


def test_a_wait_on_the_page_reaches_the_controller(
    controller_factory: Callable[..., ControllerProcess],
    agents: Callable[..., AgentProcess],
    libraries: Callable[..., Library],
    world: Path,
) -> None:
    ctl = controller_factory("--capacity", "40MiB/s", "--node-bandwidth", "8MiB/s")
    # A long tick: only the eventfd can make the agent look at the page in time.
    agents(*agent_args(ctl, world, "--tick", "30"))
    lib = libraries({"BURSTCTL_JOB_ID": "waits"})
    assert lib.attach() == "waits"
    wait_until(lambda: "waits" in jobs_of(ctl), timeout=10, interval=0.05)
    assert jobs_of(ctl)["waits"]["wait_seconds"] == 0
    lib.do("hold")  # waiters 0 -> 1 and the eventfd
    wait_until(
        lambda: jobs_of(ctl)["waits"]["wait_seconds"] > 0,
        timeout=10,
        interval=0.05,
        message="the controller to see the job wait",
    )
    lib.do("unhold")


def test_controller_down_the_page_gets_the_fallback_and_an_agent_restart_new_pages(
    controller_factory: Callable[..., ControllerProcess],
    agents: Callable[..., AgentProcess],
    libraries: Callable[..., Library],
    world: Path,
) -> None:
    ctl = controller_factory(
        "--capacity", "40MiB/s", "--node-bandwidth", "8MiB/s", env={"BURSTCTL_LEASE": "1"}
    )
    agent = agents(*agent_args(ctl, world, "--fallback", "fixed:3MiB/s"))
    lib = libraries({"BURSTCTL_JOB_ID": "fb"})
    assert lib.attach() == "fb"
    start_phase(ctl, lib, "fb")
    wait_until(
        lambda: (
            lib.rate()[0] > 0
            and lib.rate()[0] == pytest.approx(jobs_of(ctl).get("fb", {}).get("rate", -1))
        ),
        timeout=10,
        interval=0.05,
    )
    assert lib.rate()[0] != 3 * MiB
    ctl.stop(signal.SIGKILL)
    # Within one lease (1 s) and some grace for the loaded machine.
    wait_until(lambda: lib.rate()[0] == 3 * MiB, timeout=5, interval=0.02, message="fallback")
    # The agent dies: its pages go stale and closed; a new agent hands out new pages.
    assert agent.stop(signal.SIGKILL) == -signal.SIGKILL
    wait_until(lambda: lib.rate()[3] > 0.5, message="a stale heartbeat")
    again = agents(*agent_args(ctl, world, "--fallback", "fixed:5MiB/s"))
    assert "removed the stale socket" in again.log_text
    assert lib.attach() == "fb"  # the library's retry: a new connection, a new page
    wait_until(lambda: lib.rate()[0] == 5 * MiB, timeout=10, interval=0.02)
    assert lib.rate()[3] < 1.0


def test_a_process_of_another_uid_never_gets_a_root_jobs_page(
    controller_factory: Callable[..., ControllerProcess],
    agents: Callable[..., AgentProcess],
    libraries: Callable[..., Library],
    world: Path,
) -> None:
    ctl = controller_factory("--capacity", "100MiB/s", "--node-bandwidth", "8MiB/s")
    token = (ctl.state_dir / "admin-token").read_text().strip()
    body = {"job_id": "777", "user": "root", "group": "root", "nodes": 4}
    r = httpx.post(
        f"{ctl.url}/v1/jobs", json=body, headers={"Authorization": f"Bearer {token}"}, timeout=5
    )
    assert r.status_code == 201, r.text
    agent = agents(*agent_args(ctl, world))
    owner = libraries({"SLURM_JOB_ID": "777"})
    assert owner.attach() == "777"
    intruder = libraries({"SLURM_JOB_ID": "777"}, as_nobody=True)
    assert intruder.attach() == "user:nobody"  # refused 777: its own default job
    owner.do("write", MiB)
    intruder.do("write", 2 * MiB)
    wait_until(
        lambda: (
            jobs_of(ctl).get("777", {}).get("bytes_written") == MiB
            and jobs_of(ctl).get("user:nobody", {}).get("bytes_written") == 2 * MiB
        ),
        timeout=15,
        interval=0.05,
        message="each uid's bytes in its own job",
    )
    # Nor can it reach the owner's page through /proc: the memfd and its mapping are there,
    # and the kernel lets no other uid open them.
    fds = Path(f"/proc/{owner.pid}/fd")
    pages = [fd for fd in fds.iterdir() if "burstctl-job-777" in os.readlink(fd)]
    maps = [
        f"/proc/{owner.pid}/map_files/{line.split()[0]}"
        for line in Path(f"/proc/{owner.pid}/maps").read_text().splitlines()
        if "burstctl-job-777" in line
    ]
    assert pages and maps
    probe = (
        "import sys\n"
        "for path in sys.argv[1:]:\n"
        "    try:\n"
        "        open(path, 'r+b').close()\n"
        "        print('opened', path)\n"
        "    except OSError as err:\n"
        "        print('refused', err.errno)\n"
    )
    done = subprocess.run(
        [*NOBODY, sys.executable, "-c", probe, *map(str, pages), *maps],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert "opened" not in done.stdout and done.stdout.count("refused") == len(pages) + len(maps)
    status = {(j["job_id"], j["user"]): j for j in agent.status()["jobs"]}
    assert status["777", "root"]["connections"] == [owner.pid]
    assert status["user:nobody", "nobody"]["connections"] == [intruder.pid]
    assert ("777", "nobody") not in status or not status["777", "nobody"]["page"]


def test_socket_modes_status_paths_and_sigterm_cleanup(
    controller_factory: Callable[..., ControllerProcess],
    agents: Callable[..., AgentProcess],
    libraries: Callable[..., Library],
    world: Path,
) -> None:
    ctl = controller_factory()
    run = world / "run" / "burstctl"
    agent = agents(*agent_args(ctl, world))
    assert stat.S_IMODE(run.stat().st_mode) == 0o755
    assert stat.S_ISSOCK(agent.socket.stat().st_mode)
    assert stat.S_IMODE(agent.socket.stat().st_mode) == 0o666
    assert agent.request(b"PATHS") == f"PATHS {world / 'bb'}"
    assert agent.request(b"HELLO") == "NO unknown request"
    assert agent.status()["jobs"] == []
    # A second agent on the same socket refuses to start, naming the flag.
    second = AgentProcess(agent.socket, agent_args(ctl, world))
    assert second.proc.wait(30) == 2
    second.stop()
    assert "--socket" in second.log_text and "already listens" in second.log_text
    lib = libraries({"BURSTCTL_JOB_ID": "bye"})
    assert lib.attach() == "bye"
    assert agent.stop(signal.SIGTERM) == 0
    assert not agent.socket.exists()
    _, _, flags, _ = lib.rate()
    assert flags & layout.FLAG_CLOSED
    assert "session closed" in agent.log_text


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--paths", "/tmp"], "--controller"),
        (["--controller", "127.0.0.1:1", "--paths", "relative/bb"], "--paths"),
        (["--controller", "127.0.0.1:1", "--paths", "/nonexistent-bb"], "--paths"),
        (["--controller", "127.0.0.1:1", "--paths", "/tmp:/var"], "--paths"),
        (["--controller", "127.0.0.1:1", "--paths", "/tmp", "--socket", "/proc/x/s"], "--socket"),
        (["--controller", "127.0.0.1:1", "--paths", "/tmp", "--tick", "0"], "--tick"),
    ],
)
def test_bad_input_exits_2_naming_the_flag(args: list[str], flag: str) -> None:
    done = run_burstctl("agent", *args, env=CLEAN)
    assert done.returncode == 2, done.stderr
    assert flag in done.stderr.splitlines()[-1]
