"""Attribution and pacing through a real mount, against a scripted controller.

The "applications" are child processes with chosen environments that read and write through
the mount on command (stdin) and acknowledge each command (stdout), so every step is in a known
order without sleeping. The `FakeController` records what the mount's job sessions say.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import psutil
import pytest
from fake_controller import FakeController
from support import ControllerProcess, MountProcess, clean_env, is_mounted, wait_until

from burstctl.node.attribution import Attributor, Caller

pytestmark = pytest.mark.integration

MiB = 1 << 20
KiB = 1 << 10

# An application: opens, writes, reads and closes files through the mount on command.
# ``writes PATH CHUNK N`` writes N chunks, ``writes_for PATH CHUNK SECONDS`` writes chunks for
# that long, each as fast as the mount lets it; both answer the CLOCK_MONOTONIC time at which
# each write returned (taken by the application itself: no pipe round trip per chunk).
APP = r"""
import os, sys, time
fds = {}
for line in sys.stdin:
    cmd, *args = line.split()
    if cmd == "open":
        fds[args[0]] = os.open(args[0], os.O_CREAT | os.O_RDWR, 0o644)
    elif cmd == "write":
        os.write(fds[args[0]], b"x" * int(args[1]))
    elif cmd in ("writes", "writes_for"):
        fd, data, times = fds[args[0]], b"x" * int(args[1]), []
        end = time.monotonic() + float(args[2])
        for _ in range(int(args[2]) if cmd == "writes" else 1 << 62):
            if cmd == "writes_for" and time.monotonic() >= end:
                break
            os.write(fd, data)
            times.append(time.monotonic())
        print("ok", *times, flush=True)
        continue
    elif cmd == "read":
        fd = fds[args[0]]
        os.lseek(fd, 0, os.SEEK_SET)
        left = int(args[1])
        while left > 0:
            got = os.read(fd, min(left, 1 << 20))
            if not got:
                break
            left -= len(got)
    elif cmd == "close":
        os.close(fds.pop(args[0]))
    print("ok", flush=True)
"""


class App:
    """A child process that does I/O on command, with its own environment."""

    def __init__(self, env: dict[str, str], argv: list[str] | None = None) -> None:
        clean = clean_env(("BURSTCTL_", "SLURM_"))
        self.proc = subprocess.Popen(
            argv or [sys.executable, "-c", APP],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**clean, **env},
        )

    def do(self, *command: object) -> None:
        assert self.ask(*command) == [], f"the app answered more than ok to {command}"

    def ask(self, *command: object) -> list[str]:
        """Runs ``command``; what the app answered after its ``ok``."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(" ".join(map(str, command)) + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline().split()
        assert answer[:1] == ["ok"], f"the app failed on {command}"
        return answer[1:]

    def write_times(self, *command: object) -> list[float]:
        """``writes``/``writes_for``: when each write returned (CLOCK_MONOTONIC)."""
        return [float(t) for t in self.ask(*command)]

    def exit(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        assert self.proc.wait(30) == 0
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.fixture
def apps() -> Iterator[Callable[..., App]]:
    started: list[App] = []

    def make(env: dict[str, str] | None = None, argv: list[str] | None = None) -> App:
        app = App(env or {}, argv)
        started.append(app)
        return app

    yield make
    for app in started:
        if app.proc.poll() is None:
            app.proc.kill()  # by pid: only what this test started
            app.proc.wait(10)
        for pipe in (app.proc.stdin, app.proc.stdout):
            if pipe is not None and not pipe.closed:
                pipe.close()


@pytest.fixture
def paced_mount(
    fake_controller: Callable[..., FakeController],
    fuse_mount: Callable[..., MountProcess],
    fuse_dirs: tuple[Path, Path],
) -> Callable[..., tuple[FakeController, MountProcess, Path]]:
    """``paced_mount(*mount_args, **controller_kwargs) -> (controller, mount, mountpoint)``:
    a mount of ``fuse_dirs`` paced by a fresh scripted controller."""

    def make(*args: str, **kwargs: object) -> tuple[FakeController, MountProcess, Path]:
        fake = fake_controller(**kwargs)
        backing, mnt = fuse_dirs
        return fake, fuse_mount(backing, mnt, "--controller", fake.address, *args), mnt

    return make


def hellos(fake: FakeController) -> dict[str, object]:
    """Job id -> its Hello, for every stream the controller saw."""
    return {h.job_id: h for h in fake.bodies("hello")}


def stream_of(fake: FakeController, job_id: str, nth: int = 0) -> int:
    streams = [r.stream for r in fake.received("hello") if r.message.hello.job_id == job_id]
    return streams[nth]


def default_job_of_this_process() -> str:
    """The job a child of this process with no job variables lands in (see attribution)."""
    return Attributor().job_for(Caller(os.getpid(), os.getuid(), os.getgid())).job_id


def test_jobs_come_from_the_callers_environment(
    paced_mount: Callable[..., tuple[FakeController, MountProcess, Path]],
    apps: Callable[..., App],
) -> None:
    fake, _, mnt = paced_mount(initial_rate=64 * MiB)

    alpha = apps({"BURSTCTL_JOB_ID": "alpha", "SLURM_NNODES": "4", "BURSTCTL_PRIORITY": "2.5"})
    beta = apps({"SLURM_JOB_ID": "beta", "SLURM_JOB_NUM_NODES": "2"})
    nobody_in_particular = apps({})
    # A child whose own environment is empty inherits the job of its parent (the shell).
    orphan_env = apps(
        {"SLURM_JOBID": "gamma"},
        ["/bin/sh", "-c", f'env -i {sys.executable} -c "$0"; exit $?', APP],
    )
    for i, app in enumerate((alpha, beta, nobody_in_particular, orphan_env)):
        app.do("open", mnt / f"f{i}")
        app.do("write", mnt / f"f{i}", 100 * KiB)
        app.do("close", mnt / f"f{i}")

    default = default_job_of_this_process()
    fake.wait_for(lambda: {"alpha", "beta", "gamma", default} <= set(hellos(fake)))
    seen = hellos(fake)
    assert (seen["alpha"].nodes, seen["alpha"].priority, seen["alpha"].user) == (4, 2.5, "root")
    assert (seen["beta"].nodes, seen["beta"].priority) == (2, 1.0)
    assert seen["gamma"].nodes == 1
    assert set(seen) == {"alpha", "beta", "gamma", default}
    for app in (alpha, beta, nobody_in_particular, orphan_env):
        app.exit()


def test_reads_and_writes_are_paced_at_the_jobs_allocation(
    fake_controller: Callable[..., FakeController],
    fuse_mount: Callable[..., MountProcess],
    fuse_dirs: tuple[Path, Path],
    apps: Callable[..., App],
) -> None:
    fake = fake_controller(initial_rate=1 * MiB, burst=64 * KiB)
    backing, mnt = fuse_dirs
    fuse_mount(backing, mnt, "--controller", fake.address)
    app = apps({"BURSTCTL_JOB_ID": "slow"})
    app.do("open", mnt / "f")

    started = time.monotonic()
    app.do("write", mnt / "f", 3 * MiB // 2)
    write_seconds = time.monotonic() - started
    app.do("close", mnt / "f")
    app.do("open", mnt / "f")  # a new open drops the kernel's cached pages: reads reach us
    started = time.monotonic()
    app.do("read", mnt / "f", 1 * MiB)
    read_seconds = time.monotonic() - started
    app.do("close", mnt / "f")
    app.exit()

    # 1.5 MiB at 1 MiB/s with a 64 KiB bucket takes ~1.4 s; 1 MiB of reads ~1 s.
    # Loose lower bounds (the real speed targets live in bench/).
    assert write_seconds > 1.0, write_seconds
    assert read_seconds > 0.6, read_seconds
    assert (backing / "f").stat().st_size == 3 * MiB // 2
    stream = stream_of(fake, "slow")
    fake.wait_for(
        lambda: sum(u.bytes for u in fake.bodies("usage", stream)) >= 5 * MiB // 2,
        timeout=10,
    )


@pytest.mark.parametrize("libfuse", ["3"], indirect=True)  # above the binding: conftest.py
def test_a_phase_ends_at_the_last_close(
    paced_mount: Callable[..., tuple[FakeController, MountProcess, Path]],
    apps: Callable[..., App],
) -> None:
    # A quiet gap far longer than the test: only the last close can end the phase. At 1 MiB/s
    # the 1.5 MiB written make the phase longer than SHORT_PHASE (1 s), so it ends at once.
    fake, _, mnt = paced_mount("--quiet-gap", "60", initial_rate=1 * MiB)
    app = apps({"BURSTCTL_JOB_ID": "closer"})
    app.do("open", mnt / "a")
    app.do("open", mnt / "b")
    started = time.monotonic()
    for _ in range(3):
        app.do("write", mnt / "a", 256 * KiB)
        app.do("write", mnt / "b", 256 * KiB)
    assert time.monotonic() - started >= 1.0  # paced: the phase is not a short one
    app.do("close", mnt / "a")
    stream = stream_of(fake, "closer")
    fake.wait_for(lambda: len(fake.bodies("op_posted", stream)) >= 1)
    posted = fake.bodies("op_posted", stream)
    assert len(posted) == 1 and posted[0].volume == 0  # one phase, volume unknown
    assert fake.bodies("op_completed", stream) == []  # "b" is still open
    closed = time.monotonic()
    app.do("close", mnt / "b")
    fake.wait_for(lambda: len(fake.bodies("op_completed", stream)) == 1, timeout=10)
    assert fake.received("op_completed", stream)[0].at - closed < 5  # at once, not in 60 s
    assert fake.bodies("op_completed", stream)[0].op_id == posted[0].op_id
    app.exit()


def test_many_small_files_in_a_row_are_one_phase(
    paced_mount: Callable[..., tuple[FakeController, MountProcess, Path]],
    apps: Callable[..., App],
) -> None:
    # tar, a build: open, write, close, next file. Each close is the job's last, but the phase
    # is short: it is left to the quiet gap, so the controller sees one operation, not one per
    # file (20k files would be 40k messages and decisions).
    fake, _, mnt = paced_mount("--quiet-gap", "0.5", initial_rate=64 * MiB)
    app = apps({"BURSTCTL_JOB_ID": "untar"})
    for i in range(20):
        app.do("open", mnt / f"f{i}")
        app.do("write", mnt / f"f{i}", 4 * KiB)
        app.do("close", mnt / f"f{i}")
    done = time.monotonic()
    stream = stream_of(fake, "untar")
    fake.wait_for(lambda: len(fake.bodies("op_completed", stream)) == 1, timeout=10)
    assert len(fake.bodies("op_posted", stream)) == 1
    assert fake.received("op_completed", stream)[0].at - done >= 0.4  # the quiet gap's doing
    app.exit()


def test_a_phase_ends_after_a_quiet_gap_and_the_next_request_starts_another(
    paced_mount: Callable[..., tuple[FakeController, MountProcess, Path]],
    apps: Callable[..., App],
) -> None:
    fake, _, mnt = paced_mount("--quiet-gap", "0.1", initial_rate=64 * MiB)
    app = apps({"BURSTCTL_JOB_ID": "bursty"})
    app.do("open", mnt / "f")
    asked = time.monotonic()  # before the write's last request is paced
    app.do("write", mnt / "f", 512 * KiB)
    stream = stream_of(fake, "bursty")
    # The file stays open: the quiet gap alone ends the phase, not before it has passed.
    fake.wait_for(lambda: len(fake.bodies("op_completed", stream)) == 1, timeout=10)
    assert fake.received("op_completed", stream)[0].at - asked >= 0.1
    app.do("write", mnt / "f", 512 * KiB)
    fake.wait_for(lambda: len(fake.bodies("op_posted", stream)) == 2, timeout=10)
    fake.wait_for(lambda: len(fake.bodies("op_completed", stream)) == 2, timeout=10)
    kinds = {p.kind for p in fake.bodies("op_posted", stream)}
    assert len(kinds) == 1  # both write phases
    app.do("close", mnt / "f")
    app.exit()


def test_an_idle_session_says_goodbye_and_a_new_request_opens_another(
    paced_mount: Callable[..., tuple[FakeController, MountProcess, Path]],
    apps: Callable[..., App],
) -> None:
    fake, mount, mnt = paced_mount("--session-idle", "0.3", initial_rate=64 * MiB)
    app = apps({"BURSTCTL_JOB_ID": "napper"})
    app.do("open", mnt / "f")
    app.do("write", mnt / "f", 64 * KiB)
    fake.wait_for(lambda: len(fake.received("goodbye")) == 1, timeout=10)
    app.do("write", mnt / "f", 64 * KiB)  # the file stayed open: a new session takes over
    fake.wait_for(lambda: len(hellos_of(fake, "napper")) == 2, timeout=10)
    app.do("close", mnt / "f")
    app.exit()
    wait_until(lambda: "session closed (quiet)" in mount.log_text, timeout=10)


def hellos_of(fake: FakeController, job_id: str) -> list[object]:
    return [h for h in fake.bodies("hello") if h.job_id == job_id]


def test_unmount_ends_phases_and_says_goodbye(
    paced_mount: Callable[..., tuple[FakeController, MountProcess, Path]],
    apps: Callable[..., App],
) -> None:
    fake, mount, mnt = paced_mount("--quiet-gap", "60", initial_rate=64 * MiB)
    app = apps({"BURSTCTL_JOB_ID": "leaver"})
    app.do("open", mnt / "f")
    app.do("write", mnt / "f", 64 * KiB)
    app.do("close", mnt / "f")
    app.exit()
    assert mount.stop() == 0
    assert not is_mounted(mnt)
    stream = stream_of(fake, "leaver")
    fake.wait_for(lambda: len(fake.received("goodbye", stream)) == 1, timeout=10)


def test_a_blocked_request_is_let_through_at_unmount(
    fake_controller: Callable[..., FakeController],
    fuse_mount: Callable[..., MountProcess],
    fuse_dirs: tuple[Path, Path],
    apps: Callable[..., App],
) -> None:
    fake = fake_controller(initial_rate=0.0)  # "wait": nothing moves until told otherwise
    backing, mnt = fuse_dirs
    mount = fuse_mount(backing, mnt, "--controller", fake.address)
    app = apps({"BURSTCTL_JOB_ID": "stuck"})
    app.do("open", mnt / "f")
    assert app.proc.stdin is not None
    app.proc.stdin.write(f"write {mnt / 'f'} {64 * KiB}\n")
    app.proc.stdin.flush()
    stream = stream_of_when_ready(fake, "stuck")
    fake.wait_for(lambda: any(u.waiting for u in fake.bodies("usage", stream)), timeout=10)
    assert app.proc.poll() is None
    os.kill(mount.pid, signal.SIGTERM)
    assert app.proc.stdout is not None
    assert app.proc.stdout.readline() == "ok\n"  # the write went through, unpaced
    app.do("close", mnt / "f")
    app.exit()
    assert mount.stop() == 0
    assert (backing / "f").stat().st_size == 64 * KiB


def stream_of_when_ready(fake: FakeController, job_id: str) -> int:
    fake.wait_for(lambda: job_id in hellos(fake), timeout=10)
    return stream_of(fake, job_id)


def test_an_unreachable_controller_falls_back(
    fuse_mount: Callable[..., MountProcess],
    fuse_dirs: tuple[Path, Path],
    apps: Callable[..., App],
) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    backing, mnt = fuse_dirs
    mount = fuse_mount(
        backing,
        mnt,
        "--controller",
        f"127.0.0.1:{port}",
        "--attach-timeout",
        "0.2",
        "--fallback",
        "unthrottled",
    )
    app = apps({"BURSTCTL_JOB_ID": "alone"})
    app.do("open", mnt / "f")
    app.do("write", mnt / "f", 4 * MiB)
    app.do("close", mnt / "f")
    app.exit()
    assert (backing / "f").stat().st_size == 4 * MiB
    wait_until(lambda: "fallback unthrottled" in mount.log_text, timeout=10)


@pytest.mark.parametrize("libfuse", ["3"], indirect=True)  # above the binding: conftest.py
def test_a_registered_job_is_never_taken_by_another_uid(
    controller_factory: Callable[..., ControllerProcess],
    fuse_mount: Callable[..., MountProcess],
    apps: Callable[..., App],
) -> None:
    # Issue 15, finding 3: with job 777 registered to root, a process of uid nobody naming
    # 777 that reached the mount first got job 777 (and its share), while root's own I/O was
    # moved to user:root. Now the controller refuses nobody's session of 777 and the mount
    # sends nobody's I/O to nobody's own default job, whoever comes first.
    ctl = controller_factory("--capacity", "100MiB/s", "--node-bandwidth", "8MiB/s")
    assert ctl.url is not None and ctl.address is not None
    token = (ctl.state_dir / "admin-token").read_text().strip()
    body = {"job_id": "777", "user": "root", "group": "root", "nodes": 64}
    r = httpx.post(f"{ctl.url}/v1/jobs", json=body, headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 201, r.text

    def jobs() -> dict[str, dict[str, object]]:
        return {j["job_id"]: j for j in httpx.get(f"{ctl.url}/v1/jobs").json()}

    world = Path(tempfile.mkdtemp(prefix="burstctl-pacing-"))
    try:
        world.chmod(0o755)
        backing, mnt = world / "backing", world / "mnt"
        mount = fuse_mount(backing, mnt, "--controller", ctl.address, "--allow-other")
        os.chmod(mnt, 0o777)
        # nobody first (setpriv, not Popen(user=...): that forks this process, whose gRPC
        # threads make the child crash before exec).
        subprocess.run(
            [
                "setpriv",
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "/bin/sh",
                "-c",
                f"head -c {MiB} /dev/zero > {mnt}/theirs",
            ],
            env={"SLURM_JOB_ID": "777", "PATH": "/usr/bin:/bin"},
            check=True,
            timeout=30,
        )
        owner = apps({"SLURM_JOB_ID": "777"})
        owner.do("open", mnt / "mine")
        owner.do("write", mnt / "mine", 2 * MiB)
        owner.do("close", mnt / "mine")
        owner.exit()
        wait_until(
            lambda: (
                jobs().get("777", {}).get("bytes_moved") == 2 * MiB
                and jobs().get("user:nobody", {}).get("bytes_moved") == MiB
            ),
            timeout=15,
            interval=0.05,
            message="root's bytes in job 777, nobody's in user:nobody",
        )
        table = jobs()
        assert table["777"]["user"] == "root" and table["777"]["registered"]
        assert table["user:nobody"]["user"] == "nobody"
        assert "user:root" not in table  # root's own I/O stayed in its job
        wait_until(lambda: "uid 65534 may not join job '777'" in mount.log_text)
        assert os.stat(backing / "theirs").st_uid == 65534
        mount.stop()
    finally:
        if is_mounted(world / "mnt"):
            subprocess.run(["fusermount", "-u", "-z", str(world / "mnt")], check=False)
        shutil.rmtree(world)


def test_a_held_job_does_not_hold_up_another(
    fake_controller: Callable[..., FakeController],
    fuse_mount: Callable[..., MountProcess],
    fuse_dirs: tuple[Path, Path],
    apps: Callable[..., App],
) -> None:
    fake = fake_controller(initial_rate=0.0)  # every job waits until the test says otherwise
    backing, mnt = fuse_dirs
    fuse_mount(backing, mnt, "--controller", fake.address)
    held, free = apps({"BURSTCTL_JOB_ID": "held"}), apps({"BURSTCTL_JOB_ID": "free"})
    held.do("open", mnt / "h")
    assert held.proc.stdin is not None and held.proc.stdout is not None
    held.proc.stdin.write(f"write {mnt / 'h'} {256 * KiB}\n")
    held.proc.stdin.flush()
    held_stream = stream_of_when_ready(fake, "held")
    fake.wait_for(lambda: any(u.waiting for u in fake.bodies("usage", held_stream)), timeout=10)

    free.do("open", mnt / "f")
    assert free.proc.stdin is not None and free.proc.stdout is not None
    free.proc.stdin.write(f"write {mnt / 'f'} {256 * KiB}\n")
    free.proc.stdin.flush()
    fake.push(64 * MiB, stream=stream_of_when_ready(fake, "free"))
    assert free.proc.stdout.readline() == "ok\n"
    for _ in range(8):  # the other job's I/O flows on other FUSE threads meanwhile
        free.do("write", mnt / "f", 256 * KiB)
    assert held.proc.poll() is None and (backing / "h").stat().st_size == 0

    fake.push(64 * MiB, stream=held_stream)
    assert held.proc.stdout.readline() == "ok\n"
    for app, name in ((held, "h"), (free, "f")):
        app.do("close", mnt / name)
        app.exit()
    assert (backing / "f").stat().st_size == 9 * 256 * KiB
    assert (backing / "h").stat().st_size == 256 * KiB


def test_jobs_share_the_mounts_loop_thread_and_connection(
    paced_mount: Callable[..., tuple[FakeController, MountProcess, Path]],
    apps: Callable[..., App],
) -> None:
    # Sessions stay open for the whole test: each job keeps its session.
    fake, mount, mnt = paced_mount("--session-idle", "120", initial_rate=64 * MiB)
    daemon = psutil.Process(mount.pid)

    def run_job(name: str) -> None:
        app = apps({"BURSTCTL_JOB_ID": name})
        app.do("open", mnt / name)
        app.do("write", mnt / name, 64 * KiB)
        app.do("close", mnt / name)
        app.exit()

    run_job("first")
    fake.wait_for(lambda: "first" in hellos(fake), timeout=10)
    threads = daemon.num_threads()
    for i in range(12):
        run_job(f"job{i}")
    fake.wait_for(lambda: len(hellos(fake)) == 13, timeout=10)
    assert fake.received("goodbye") == []  # all 13 sessions are open
    # A thread per job would be 12 more; libfuse starts a few workers as it sees fit.
    assert daemon.num_threads() - threads <= 12 // 2
    to_controller = [
        c
        for c in daemon.net_connections("tcp")
        if c.raddr and c.raddr.port == fake.port and c.status == psutil.CONN_ESTABLISHED
    ]
    assert len(to_controller) == 1


@pytest.mark.parametrize("libfuse", ["3"], indirect=True)  # above the binding: conftest.py
def test_the_mount_carries_the_controllers_secret(
    controller_factory: Callable[..., ControllerProcess],
    fuse_mount: Callable[..., MountProcess],
    apps: Callable[..., App],
    tmp_path: Path,
) -> None:
    secret = tmp_path / "grpc-secret"
    secret.write_text("mount-secret\n")
    secret.chmod(0o600)
    ctl = controller_factory(env={"BURSTCTL_GRPC_SECRET_FILE": str(secret)})
    assert ctl.url is not None and ctl.address is not None

    def moved(job_id: str) -> object:
        jobs = {j["job_id"]: j for j in httpx.get(f"{ctl.url}/v1/jobs").json()}
        return jobs.get(job_id, {}).get("bytes_moved")

    vouched = fuse_mount(
        tmp_path / "b1", tmp_path / "m1", "--controller", ctl.address, "--secret-file", str(secret)
    )
    bare = fuse_mount(
        tmp_path / "b2",
        tmp_path / "m2",
        "--controller",
        ctl.address,
        "--attach-timeout",
        "30",
        "--fallback-grace",
        "0.5",
    )
    for mnt, job in ((tmp_path / "m1", "sec"), (tmp_path / "m2", "nosec")):
        app = apps({"BURSTCTL_JOB_ID": job})
        app.do("open", mnt / "f")
        # the bare mount's session is refused: its fallback applies at once, not after the
        # 30 s attach timeout (keep-last: 0 through the grace, then the conservative rate)
        app.do("write", mnt / "f", MiB)
        app.do("close", mnt / "f")
        app.exit()
    wait_until(lambda: moved("sec") == MiB, timeout=15, interval=0.05, message="bytes of sec")
    assert moved("nosec") is None  # never admitted
    assert "refused the session: UNAUTHENTICATED" in bare.log_text
    assert "refused" not in vouched.log_text
    vouched.stop()
    bare.stop()
