"""The LD_PRELOAD library (preload_shim/*.c) on real programs, against a fake agent.

Real dd, cp, tar, Python and a C probe program (probe.c, compiled here with gcc) run with
``LD_PRELOAD=library_path()`` and the protocol's environment; the fake agent (fake_agent.py)
serves one job page whose rate each test sets, and the tests read that page's counters.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_agent import FakeAgent
from support import clean_env, wait_until

from burstctl.preload_shim.library import library_path
from burstctl.preload_shim.page import JobPage, _library, monotonic_ns

pytestmark = pytest.mark.integration

MiB = 1 << 20
K64 = 64 * 1024
HERE = Path(__file__).resolve().parent
INF = float("inf")


def build_probe(out: Path, *flags: str) -> Path:
    src = str(HERE / "probe.c")
    subprocess.run(["gcc", "-O2", *flags, "-o", str(out), src, "-lpthread"], check=True)
    return out


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """probe.c, built as dd and fio are (64-bit file offsets, optimised)."""
    return build_probe(tmp_path_factory.mktemp("probe") / "probe", "-D_FILE_OFFSET_BITS=64")


@pytest.fixture(scope="module")
def probe_fortified(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """probe.c with _FORTIFY_SOURCE: its reads become the checked forms (__read_chk...)."""
    out = tmp_path_factory.mktemp("probe") / "probe-fortified"
    return build_probe(out, "-D_FORTIFY_SOURCE=2", "-D_FILE_OFFSET_BITS=64")


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    # A short directory: a Unix socket's path must fit in 108 bytes.
    d = Path(tempfile.mkdtemp(prefix="bc-pl-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def bb(tmp_path: Path) -> Path:
    d = tmp_path / "bb"
    d.mkdir()
    return d


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    d = tmp_path / "outside"
    d.mkdir()
    return d


@pytest.fixture
def agent(sock_dir: Path, bb: Path) -> Iterator[FakeAgent]:
    a = FakeAgent(sock_dir / "agent.sock", [str(bb)])
    yield a
    a.close()


def shim_env(socket_path: Path, paths: str | None, **extra: str) -> dict[str, str]:
    env = clean_env()
    env.pop("LD_PRELOAD", None)
    env["LD_PRELOAD"] = str(library_path())
    env["BURSTCTL_AGENT_SOCKET"] = str(socket_path)
    if paths is not None:
        env["BURSTCTL_PRELOAD_PATHS"] = paths
    env.update(extra)
    return env


def run(
    cmd: list[str], env: dict[str, str] | None, timeout: float = 30.0
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def plain_env() -> dict[str, str]:
    env = clean_env()
    env.pop("LD_PRELOAD", None)
    return env


def warnings_of(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("burstctl-preload")]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class Background:
    """A child process the test stops by pid if it is still running at the end."""

    def __init__(self, cmd: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )

    def __enter__(self) -> subprocess.Popen[str]:
        return self.proc

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, 9)
        self.proc.communicate(timeout=10)


# ---------------------------------------------------------------------- the build


def test_library_is_built_with_only_its_interface_exported() -> None:
    lib = library_path()
    nm = run(["nm", "-D", "--defined-only", str(lib)], None)
    exported = {line.split()[-1] for line in nm.stdout.splitlines() if line.strip()}
    # fmt: off
    intercepted = {
        "open", "open64", "openat", "openat64", "creat", "creat64", "__open_2", "__open64_2",
        "__openat_2", "__openat64_2", "close", "dup", "dup2", "dup3", "fcntl", "fcntl64",
        "read", "write", "pread", "pread64", "pwrite", "pwrite64", "readv", "writev", "preadv",
        "preadv64", "pwritev", "pwritev64", "preadv2", "pwritev2", "preadv64v2", "pwritev64v2",
        "__read_chk", "__pread_chk", "__pread64_chk", "copy_file_range", "sendfile",
        "sendfile64", "fopen", "fopen64", "fdopen", "freopen", "freopen64", "fread", "fwrite",
        "fread_unlocked", "fwrite_unlocked", "__fread_chk", "__fread_unlocked_chk", "fclose",
        "fflush", "chdir", "fchdir", "closedir", "close_range", "closefrom",
        # POSIX AIO (aio.c)
        "aio_read", "aio_write", "aio_read64", "aio_write64", "lio_listio", "lio_listio64",
        # metadata calls (meta.c)
        "unlink", "unlinkat", "rename", "renameat", "renameat2", "mkdir", "mkdirat", "rmdir",
        "stat", "stat64", "lstat", "lstat64", "fstatat", "fstatat64", "statx", "__xstat",
        "__xstat64", "__lxstat", "__lxstat64", "__fxstatat", "__fxstatat64", "opendir",
    }
    # fmt: on
    helpers = {name for name in exported if name.startswith("burstctl_page_")}
    assert {"burstctl_page_publish", "burstctl_page_load", "burstctl_page_store"} <= helpers
    assert "burstctl_page_reserve_and_wait" in helpers
    assert exported - helpers == intercepted
    needed = run(["readelf", "-d", str(lib)], None).stdout
    assert "libpython" not in needed
    assert "libc.so" in needed
    out = run([sys.executable, "-m", "burstctl", "preload-path"], plain_env())
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(lib)


# ---------------------------------------------------------------------- pacing


def test_dd_is_paced_at_the_page_rate(agent: FakeAgent, bb: Path) -> None:
    agent.publish(8 * MiB, burst=MiB)
    start = time.monotonic()
    out = run(
        ["dd", "if=/dev/zero", f"of={bb}/f", "bs=1M", "count=16", "status=none"],
        shim_env(agent.socket_path, str(bb)),
    )
    elapsed = time.monotonic() - start
    assert out.returncode == 0, out.stderr
    assert warnings_of(out.stderr) == []
    # 16 MiB at 8 MiB/s, the first MiB of it free (the burst): 1.875 s.
    assert 1.5 < elapsed < 4.0, elapsed
    c = agent.page.counters()
    assert c.req_write >= 16 * MiB
    assert c.moved_write == 16 * MiB
    assert c.calls_write == 16
    assert c.req_read == 0  # /dev/zero is not under the paths
    assert c.waits > 0 and c.wait_ns > 1e9
    assert c.waiters == 0
    assert (bb / "f").stat().st_size == 16 * MiB


def test_unlimited_rate_never_waits(agent: FakeAgent, bb: Path) -> None:
    agent.publish(INF)
    out = run(
        ["dd", "if=/dev/zero", f"of={bb}/f", "bs=1M", "count=32", "status=none"],
        shim_env(agent.socket_path, str(bb)),
    )
    assert out.returncode == 0, out.stderr
    c = agent.page.counters()
    assert c.req_write == 32 * MiB and c.moved_write == 32 * MiB
    assert c.waits == 0 and c.wait_ns == 0


def test_rate_zero_waits_until_the_rate_is_raised(agent: FakeAgent, bb: Path) -> None:
    agent.publish(0.0, burst=0)
    env = shim_env(agent.socket_path, str(bb))
    cmd = ["dd", "if=/dev/zero", f"of={bb}/f", "bs=64k", "count=4", "status=none"]
    with Background(cmd, env) as proc:
        wait_until(lambda: agent.page.counters().waiters == 1, timeout=10, message="a waiter")
        assert agent.page.drain_events() >= 1  # the first waiter rang the eventfd
        assert proc.poll() is None  # still waiting: nothing flows at rate 0
        assert agent.page.counters().moved_write == 0
        agent.publish(INF)
        assert proc.wait(timeout=10) == 0
    c = agent.page.counters()
    assert c.moved_write == 4 * K64
    assert c.waiters == 0 and c.waits >= 1 and c.wait_ns > 0


def test_threads_share_the_page_rate(agent: FakeAgent, bb: Path, probe: Path) -> None:
    agent.publish(8 * MiB, burst=MiB)
    start = time.monotonic()
    out = run([str(probe), "threads", f"{bb}/t", "4"], shim_env(agent.socket_path, str(bb)))
    elapsed = time.monotonic() - start
    assert out.returncode == 0, out.stderr
    # 4 threads x 2 MiB at 8 MiB/s together, the first MiB free: 0.875 s.
    assert 0.7 < elapsed < 3.0, elapsed
    c = agent.page.counters()
    assert c.req_write == 8 * MiB and c.moved_write == 8 * MiB
    assert c.waiters == 0


def test_a_thread_cancelled_while_it_waits_is_no_waiter(
    agent: FakeAgent, bb: Path, probe: Path
) -> None:
    agent.publish(0.0, burst=0)
    proc = subprocess.Popen(
        [str(probe), "cancel", f"{bb}/c"],
        env=shim_env(agent.socket_path, str(bb)),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdin is not None and proc.stdout is not None
        wait_until(lambda: agent.page.counters().waiters == 1, timeout=10, message="a waiter")
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "cancelled"
        c = agent.page.counters()
        assert c.waiters == 0 and c.moved_write == 0
        proc.stdin.write("done\n")
        proc.stdin.flush()
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, 9)
        proc.communicate(timeout=10)


# ---------------------------------------------------------------------- what is paced


def test_files_outside_the_paths_are_neither_paced_nor_counted(
    sock_dir: Path, agent: FakeAgent, bb: Path, outside: Path
) -> None:
    agent.publish(0.0, burst=0)  # anything paced would wait forever
    out = run(
        ["dd", "if=/dev/zero", f"of={outside}/f", "bs=1M", "count=64", "status=none"],
        shim_env(agent.socket_path, str(bb)),
    )
    assert out.returncode == 0, out.stderr
    # Without paths the library paces nothing, even under bb.
    out = run(
        ["dd", "if=/dev/zero", f"of={bb}/f", "bs=1M", "count=4", "status=none"],
        shim_env(agent.socket_path, None),
    )
    assert out.returncode == 0, out.stderr
    c = agent.page.counters()
    assert (c.req_read, c.req_write, c.calls_read, c.calls_write, c.taken) == (0, 0, 0, 0, 0)
    assert agent.snapshot() == ([], [])  # nobody even connected


def test_openat_from_a_directory_fd_and_chdir_are_paced(
    agent: FakeAgent, bb: Path, probe: Path
) -> None:
    agent.publish(INF)
    env = shim_env(agent.socket_path, str(bb))
    (bb / "sub").mkdir()
    out = run([str(probe), "openat", str(bb)], env)
    assert out.returncode == 0, out.stderr
    assert (bb / "rel.bin").stat().st_size == MiB
    assert agent.page.counters().req_write == MiB
    out = run([str(probe), "chdir", f"{bb}/sub/.."], env)
    assert out.returncode == 0, out.stderr
    assert (bb / "cwd.bin").stat().st_size == MiB
    assert agent.page.counters().req_write == 2 * MiB


def test_dup_copies_are_paced_and_close_forgets(agent: FakeAgent, bb: Path, probe: Path) -> None:
    agent.publish(INF)
    out = run([str(probe), "dup", f"{bb}/d"], shim_env(agent.socket_path, str(bb)))
    assert out.returncode == 0, out.stderr
    fds = out.stdout.split()
    # The pipe reuses the numbers of the closed file and its dup ...
    assert fds[2].removeprefix("pipe=") == f"{fds[0].removeprefix('fd=')},{fds[1][4:]}"
    c = agent.page.counters()
    # ... and its 4 KiB each way are not counted: close reset the numbers' state.
    assert c.req_write == 6 * K64 and c.moved_write == 6 * K64
    assert c.req_read == 0


def test_closedir_and_close_range_forget_the_numbers(
    agent: FakeAgent, bb: Path, probe: Path
) -> None:
    agent.publish(INF)
    out = run([str(probe), "closes", str(bb)], shim_env(agent.socket_path, str(bb)))
    assert out.returncode == 0, out.stderr
    dir_fd, pipe1, file_fd, pipe2 = (int(x.split("=")[1]) for x in out.stdout.split())
    assert pipe1 == dir_fd and pipe2 == file_fd  # the pipes reused the closed numbers
    attaches, _ = agent.snapshot()
    assert len(attaches) == 1  # the opens under bb were seen, and attached
    c = agent.page.counters()
    assert (c.req_read, c.req_write) == (0, 0)  # ... but the pipes' bytes were not paced


def test_the_application_closing_the_librarys_descriptors_costs_it_nothing(
    agent: FakeAgent, bb: Path, probe: Path
) -> None:
    agent.publish(8 * MiB, burst=0)  # every write waits: the first waiter rings the eventfd
    out = run([str(probe), "closeall", str(bb)], shim_env(agent.socket_path, str(bb)))
    assert out.returncode == 0, out.stderr
    # The files reused the numbers of the library's connection and eventfd; not one byte of
    # the library's went into them.
    assert sorted(int(x.split("=")[1]) for x in out.stdout.split()) == list(range(3, 9))
    want = bytes((i * 7 + 3) & 0xFF for i in range(K64))
    for i in range(6):
        assert (bb / f"f{i}.bin").read_bytes() == want
    attaches, _ = agent.snapshot()
    # The agent saw the connection end when the application closed it (the pid is done).
    wait_until(lambda: agent.snapshot()[1] == attaches, message="the connection's end")
    c = agent.page.counters()
    assert c.moved_write == 4096 + 6 * K64  # the page stayed mapped: still paced


def test_vector_range_and_sendfile_calls_are_paced(agent: FakeAgent, bb: Path, probe: Path) -> None:
    agent.publish(INF)
    out = run([str(probe), "vec", f"{bb}/v", f"{bb}/v.copy"], shim_env(agent.socket_path, str(bb)))
    assert out.returncode == 0, out.stderr
    c = agent.page.counters()
    # writev, pwritev, pwritev2: 64 KiB each; copy_file_range: 128 KiB in and out;
    # preadv, preadv2, pread, readv: 64 KiB each; sendfile to /dev/null: 192 KiB read only.
    assert c.req_write == 3 * K64 + 2 * K64
    assert c.req_read == 4 * K64 + 2 * K64 + 3 * K64
    assert c.moved_read == c.req_read and c.moved_write == c.req_write
    assert (bb / "v.copy").read_bytes() == (bb / "v").read_bytes()[: 2 * K64]


def test_the_fortified_forms_are_paced(agent: FakeAgent, bb: Path, probe_fortified: Path) -> None:
    imported = run(["nm", "-D", "--undefined-only", str(probe_fortified)], None).stdout
    for name in ("__open64_2", "__read_chk", "__pread64_chk", "__fread_chk"):
        assert name in imported  # what this test is about
    agent.publish(INF)
    (bb / "c").write_bytes(os.urandom(4 * K64))
    out = run([str(probe_fortified), "chk", f"{bb}/c", "0"], shim_env(agent.socket_path, str(bb)))
    assert out.returncode == 0, out.stderr
    c = agent.page.counters()
    # read, pread, fread, fread_unlocked: 64 KiB each (stdio's own reads are not seen).
    assert c.req_read == 4 * K64 and c.moved_read == 4 * K64
    assert c.calls_read == 4


def test_fork_child_is_counted_on_the_same_page(agent: FakeAgent, bb: Path, probe: Path) -> None:
    agent.publish(INF)
    out = run([str(probe), "fork", f"{bb}/f"], shim_env(agent.socket_path, str(bb)))
    assert out.returncode == 0, out.stderr
    assert agent.page.counters().req_write == 8 * K64
    attaches, _ = agent.snapshot()
    assert len(attaches) == 1  # the child used its parent's page and connection


def test_exec_child_attaches_itself(agent: FakeAgent, bb: Path, probe: Path) -> None:
    agent.publish(INF)
    out = run([str(probe), "forkexec", f"{bb}/a", f"{bb}/b"], shim_env(agent.socket_path, str(bb)))
    assert out.returncode == 0, out.stderr
    parent, child = (int(x.split("=")[1]) for x in out.stdout.split())
    assert agent.page.counters().req_write == K64 + 4 * K64
    wait_until(lambda: len(agent.snapshot()[1]) == 2, message="both connections closed")
    attaches, closed = agent.snapshot()
    assert attaches == [parent, child]  # the exec'ed image started fresh and attached
    assert sorted(closed) == sorted([parent, child])


def test_programs_a_shell_execs_attach_each_under_its_own_pid(agent: FakeAgent, bb: Path) -> None:
    agent.publish(INF)
    script = (
        f"dd if=/dev/zero of={bb}/a bs=64k count=2 status=none && "
        f"dd if={bb}/a of={bb}/b bs=64k status=none && echo $$"
    )
    out = run(["sh", "-c", script], shim_env(agent.socket_path, str(bb)))
    assert out.returncode == 0, out.stderr
    shell = int(out.stdout)
    wait_until(lambda: len(agent.snapshot()[1]) == 2, message="both dd done")
    attaches, closed = agent.snapshot()
    assert len(set(attaches)) == 2 and shell not in attaches  # the shell opened nothing paced
    assert sorted(closed) == sorted(attaches)
    c = agent.page.counters()
    assert c.moved_write == 4 * K64 and c.moved_read == 2 * K64


@pytest.mark.parametrize("engine", ["psync", "sync"])
def test_fio_moves_and_verifies_its_data_under_the_shim(
    agent: FakeAgent, bb: Path, engine: str
) -> None:
    agent.publish(64 * MiB, burst=MiB)
    size = 4 * MiB
    cmd = [
        "/usr/bin/fio",
        "--name=w",
        f"--filename={bb}/fio.dat",
        f"--ioengine={engine}",
        "--rw=write",
        "--bs=64k",
        f"--size={size}",
        "--verify=crc32c",
        "--do_verify=1",
        "--output-format=terse",
        "--verify_state_save=0",  # no state file in the working directory
    ]
    out = subprocess.run(
        cmd,
        env=shim_env(agent.socket_path, str(bb)),
        cwd=bb,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert warnings_of(out.stderr) == []
    c = agent.page.counters()
    # fio wrote the file, then read it all back to verify it (each block's checksum).
    assert c.moved_write >= size and c.moved_read >= size
    assert c.waits > 0  # 8 MiB at 64 MiB/s: paced


def test_stdio_is_paced_and_round_trips(agent: FakeAgent, bb: Path, probe: Path) -> None:
    agent.publish(32 * MiB, burst=256 * 1024)
    n = 4 * MiB + 12345
    out = run([str(probe), "stdio", f"{bb}/s", str(n)], shim_env(agent.socket_path, str(bb)))
    assert out.returncode == 0, (out.returncode, out.stderr)
    c = agent.page.counters()
    assert c.req_write == n and c.moved_write == n
    assert c.moved_read == n and c.req_read >= n
    assert c.waits > 0  # 8 MiB at 32 MiB/s: it waited


def test_python_open_write_is_paced(agent: FakeAgent, bb: Path) -> None:
    agent.publish(INF)
    n = 3 * MiB + 7
    data = f"bytes(range(256)) * ({n} // 256) + b'x' * ({n} % 256)"
    code = f"open({str(bb / 'p')!r}, 'wb').write({data})"
    out = run([sys.executable, "-c", code], shim_env(agent.socket_path, str(bb)))
    assert out.returncode == 0, out.stderr
    assert (bb / "p").stat().st_size == n
    c = agent.page.counters()
    assert c.req_write == n and c.moved_write == n


# ---------------------------------------------------------------------- faults


def test_agent_unreachable_runs_unpaced_with_one_warning(
    sock_dir: Path, bb: Path, probe: Path
) -> None:
    out = run([str(probe), "many", str(bb), "5"], shim_env(sock_dir / "nobody.sock", str(bb)))
    assert out.returncode == 0, out.stderr
    lines = warnings_of(out.stderr)
    assert len(lines) == 1, out.stderr
    assert "cannot attach" in lines[0] and "nobody.sock" in lines[0]
    assert [(bb / f"many.{i}").stat().st_size for i in range(5)] == [4096] * 5


def test_agent_refusal_runs_unpaced_with_its_reason(
    agent: FakeAgent, bb: Path, probe: Path
) -> None:
    agent.refuse = "no job for pid"
    agent.publish(0.0)
    out = run([str(probe), "many", str(bb), "3"], shim_env(agent.socket_path, str(bb)))
    assert out.returncode == 0, out.stderr
    lines = warnings_of(out.stderr)
    assert len(lines) == 1 and "no job for pid" in lines[0], out.stderr
    assert agent.page.counters().calls_write == 0


@pytest.mark.parametrize("size", [100, 4096])
def test_a_page_that_could_shrink_is_refused(
    agent: FakeAgent, bb: Path, probe: Path, size: int
) -> None:
    # A short or unsealed memfd would SIGBUS the application the day it shrank.
    fd = os.memfd_create("unsealed", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, size)
        os.pwrite(fd, (0x31504342 | 1 << 32).to_bytes(8, "little"), 0)  # magic and version
        agent.page_fd = fd
        out = run([str(probe), "many", str(bb), "2"], shim_env(agent.socket_path, str(bb)))
    finally:
        os.close(fd)
    assert out.returncode == 0, out.stderr
    lines = warnings_of(out.stderr)
    assert len(lines) == 1 and "not a sealed memfd" in lines[0], out.stderr


def test_stale_heartbeat_ends_a_wait_after_the_dead_bound(agent: FakeAgent, bb: Path) -> None:
    agent.publish(0.0, burst=0)
    env = shim_env(agent.socket_path, str(bb), BURSTCTL_PRELOAD_DEAD_AFTER="1")
    cmd = ["dd", "if=/dev/zero", f"of={bb}/f", "bs=64k", "count=8", "status=none"]
    with Background(cmd, env) as proc:
        wait_until(lambda: agent.page.counters().waiters == 1, timeout=10, message="a waiter")
        agent.stop_beating()
        stopped = time.monotonic()
        assert proc.wait(timeout=10) == 0
        elapsed = time.monotonic() - stopped
        stderr = proc.stderr.read() if proc.stderr else ""
    assert 0.7 < elapsed < 4.0, elapsed  # about DEAD_AFTER (1 s) after the last beat
    assert (bb / "f").stat().st_size == 8 * K64
    lines = warnings_of(stderr)
    assert len(lines) == 1 and "stale" in lines[0], stderr
    c = agent.page.counters()
    assert c.waiters == 0 and c.moved_write == K64  # the rest ran unpaced, uncounted
    wait_until(lambda: agent.snapshot()[1] == [proc.pid], message="the library hung up")


def test_closed_page_stops_pacing_and_the_library_attaches_again(
    agent: FakeAgent, bb: Path, probe: Path
) -> None:
    agent.publish(0.0, burst=0)
    env = shim_env(agent.socket_path, str(bb), BURSTCTL_PRELOAD_DEAD_AFTER="60")
    stop = bb / "stop"
    with Background([str(probe), "loop", f"{bb}/l", str(stop)], env) as proc:
        old = agent.page
        wait_until(lambda: old.counters().waiters == 1, timeout=10, message="a waiter")
        new = agent.replace_page(INF)  # FLAG_CLOSED on the old page, a new one to attach to
        wait_until(lambda: old.counters().waiters == 0, timeout=5, message="the wait ended")
        # At most a second later the library attaches again, and counts on the new page.
        wait_until(lambda: new.counters().calls_write > 0, timeout=5, message="re-attached")
        stop.touch()
        assert proc.wait(timeout=10) == 0
    attaches, closed = agent.snapshot()
    assert attaches == [proc.pid, proc.pid]
    assert proc.pid in closed  # the closed page's connection was hung up


# ---------------------------------------------------------------------- correctness


def test_dd_cp_tar_move_the_same_bytes_as_without_the_shim(
    agent: FakeAgent, bb: Path, outside: Path, tmp_path: Path
) -> None:
    agent.publish(256 * MiB, burst=4 * MiB)
    src = outside / "src.bin"
    src.write_bytes(os.urandom(6 * MiB + 4321))
    want = sha256(src)

    def workload(root: Path, env: dict[str, str]) -> list[str]:
        (root / "x").mkdir()
        steps = [
            ["cp", str(src), f"{root}/a"],
            ["dd", f"if={root}/a", f"of={root}/b", "bs=64k", "status=none"],
            ["tar", "-C", str(root), "-cf", f"{root}/t.tar", "a", "b"],
            ["tar", "-C", f"{root}/x", "-xf", f"{root}/t.tar"],
        ]
        for cmd in steps:
            out = run(cmd, env)
            assert out.returncode == 0, (cmd, out.stderr)
            assert warnings_of(out.stderr) == []
        return [sha256(root / p) for p in ("a", "b", "x/a", "x/b")]

    shimmed = workload(bb, shim_env(agent.socket_path, str(bb)))
    plain_root = tmp_path / "plain"
    plain_root.mkdir()
    plain = workload(plain_root, plain_env())
    assert shimmed == plain == [want] * 4
    c = agent.page.counters()
    size = src.stat().st_size
    # cp, dd, tar's archive and its extraction all wrote under bb; dd and tar read there.
    assert c.moved_write >= 2 * size + (bb / "t.tar").stat().st_size + 2 * size
    assert c.moved_read >= size + 2 * size + (bb / "t.tar").stat().st_size


def test_errno_is_what_it_is_without_the_shim(agent: FakeAgent, bb: Path, probe: Path) -> None:
    agent.publish(MiB, burst=0)  # the paced 64 KiB write waits about 60 ms
    (bb / "ro").write_bytes(b"r")
    shimmed = run(
        [str(probe), "errno", f"{bb}/ro", f"{bb}/w"], shim_env(agent.socket_path, str(bb))
    )
    plain = run([str(probe), "errno", f"{bb}/ro", f"{bb}/w2"], plain_env())
    assert shimmed.returncode == 0 and plain.returncode == 0, shimmed.stderr
    assert shimmed.stdout == plain.stdout
    assert shimmed.stdout.splitlines() == ["write=-1 errno=9", f"paced={K64} errno=33"]
    c = agent.page.counters()
    assert c.calls_write == 2 and c.moved_write == K64 and c.waits >= 1


# ---------------------------------------------------------------------- the page helpers


def test_reserve_and_wait_through_the_exported_helpers() -> None:
    lib = _library()
    assert lib is not None
    page = JobPage("test-page")
    try:
        page.publish(0.0, 0)
        results: list[int] = []
        waiter = threading.Thread(
            target=lambda: results.append(
                lib.burstctl_page_reserve_and_wait(page.address, 1000, page.eventfd, 0)
            )
        )
        waiter.start()
        wait_until(lambda: page.counters().waiters == 1, message="the waiter")
        assert page.drain_events() == 1
        assert results == []
        page.publish(1e9, 0)
        waiter.join(timeout=5)
        assert results == [0]
        c = page.counters()
        assert c.waiters == 0 and c.waits == 1 and c.taken >= 1000 and c.wait_ns > 0
        # The seqlock's fields, read back through the acquire loads.
        page.publish(12345.0, 777, now_ns=monotonic_ns())
        assert lib.burstctl_page_load(page.address, 40) == 777
        rate = ctypes.c_double.from_buffer_copy(
            lib.burstctl_page_load(page.address, 32).to_bytes(8, "little", signed=True)
        ).value
        assert rate == 12345.0
        assert lib.burstctl_page_load(page.address, 8) % 2 == 0  # seq even: not mid-write
        # A stale heartbeat and a closed page both end a draw at once (1: stop pacing).
        page.publish(0.0, 0)
        page.beat(monotonic_ns() - 60 * 10**9)
        assert lib.burstctl_page_reserve_and_wait(page.address, 10, page.eventfd, 0) == 1
        page.beat()
        page.mark_closed()
        assert lib.burstctl_page_reserve_and_wait(page.address, 10, page.eventfd, 0) == 1
    finally:
        page.close()
