"""``burstctl mount`` and ``burstctl umount``: the mount's lifecycle, libfuse options, signals.

`run_mount` checks a `MountConfig` against the system, daemonizes unless told to stay in the
foreground, opens the backing directory, starts the pacer on one `ClientRuntime` (when a
controller is given) and runs the FUSE loop until the file system is unmounted. SIGTERM, SIGINT
and SIGHUP are taken by a watcher thread (they are blocked everywhere else, so libfuse's own
handlers never run): it lets every paced request through, closes the job sessions, and
unmounts — lazily if files are still open, so applications keep their open files until they
close them.

FUSE options the mount always uses: ``default_permissions`` (the kernel checks modes against
the caller), ``atomic_o_trunc``, multithreaded; never the kernel writeback cache, under which
buffered writes reach the daemon from flusher threads and cannot be attributed to the writer.
The file system runs on libfuse's low-level API (`_fuse`): inode numbers are the backing
files', and an unlinked open file is never renamed.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import dataclasses
import logging
import os
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from burstctl.client.runtime import ClientRuntime
from burstctl.fuse_shim.config import (
    FUSE2_MAX_WRITE,
    LIBFUSE_CHOICES,
    MountConfig,
    MountError,
)
from burstctl.node.attribution import Attributor
from burstctl.node.options import stage_out_dir
from burstctl.node.pacer import Pacer
from burstctl.node.stageout import StageOut
from burstctl.node.stageout_journal import Journal, default_journal

logger = logging.getLogger(__name__)

_SHUTDOWN_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def validate(config: MountConfig) -> MountConfig:
    """Checks what the options need of the system: the directories, /dev/fuse and the libfuse
    chosen (loading it, see `choose_libfuse`); returns the config with absolute paths.

    The options themselves were checked when the `MountConfig` was built.
    """
    choose_libfuse(config.libfuse)
    backing = Path(os.path.realpath(config.backing))
    mountpoint = Path(os.path.realpath(config.mountpoint))
    if not backing.is_dir():
        raise MountError(f"BACKING {config.backing} is not a directory")
    if not mountpoint.is_dir():
        raise MountError(f"MOUNTPOINT {config.mountpoint} is not a directory")
    if mountpoint != backing and mountpoint.is_relative_to(backing):
        raise MountError(
            f"MOUNTPOINT {mountpoint} is inside BACKING {backing}: the mount would contain "
            "itself (mounting over BACKING itself is fine)"
        )
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        raise MountError("/dev/fuse is missing or not accessible (install fuse, load the module)")
    stage_out = None
    if config.stage_out is not None:
        buffers = [("BACKING", backing), ("MOUNTPOINT", mountpoint)]
        stage_out = stage_out_dir(config.stage_out, buffers, MountError)
    return dataclasses.replace(config, backing=backing, mountpoint=mountpoint, stage_out=stage_out)


_chosen: str | None = None  # what choose_libfuse set FUSE_LIBRARY_PATH to in this process


def choose_libfuse(choice: str) -> str | None:
    """Points the binding at libfuse 2 or 3 (``choice``: auto, 2 or 3) before it is loaded.

    Returns the library chosen; None when the user set ``FUSE_LIBRARY_PATH`` (the binding then
    loads that, whatever ``choice`` says) or, for ``auto``, when one is already loaded.
    ``auto`` takes libfuse 3 where it can mount (as root, which mounts with mount(2) itself,
    or with ``fusermount3`` installed): up to 1 MiB per request instead of 128 KiB, and less
    CPU per byte (benchmarks.md); otherwise libfuse 2. Only one libfuse can be loaded per
    process: a second, different explicit choice is an error.
    """
    global _chosen
    if choice not in LIBFUSE_CHOICES:
        raise MountError(f"--libfuse must be one of {', '.join(LIBFUSE_CHOICES)}, got {choice!r}")
    current = os.environ.get("FUSE_LIBRARY_PATH")
    if current and current != _chosen:
        return None  # the user's
    loaded = sys.modules.get("burstctl.fuse_shim._fuse")
    if choice == "auto" and loaded is not None:
        return None  # already loaded (auto has no preference to defend)
    found = {"2": ctypes.util.find_library("fuse"), "3": ctypes.util.find_library("fuse3")}
    if choice == "auto":
        can_mount_3 = os.geteuid() == 0 or shutil.which("fusermount3") is not None
        choice = "3" if found["3"] and (can_mount_3 or not found["2"]) else "2"
    library = found[choice]
    if library is None:
        package = "libfuse2" if choice == "2" else "libfuse3-3"
        raise MountError(
            f"libfuse {choice} is not installed (Debian/Ubuntu: apt-get install {package})"
        )
    if loaded is not None and str(loaded.LIBFUSE_VERSION[0]) != choice:
        raise MountError(
            f"libfuse {loaded.LIBFUSE_VERSION[0]} is already loaded in this process; "
            f"cannot switch to libfuse {choice}"
        )
    os.environ["FUSE_LIBRARY_PATH"] = _chosen = library
    return library


def fuse_option_dict(config: MountConfig) -> dict[str, str | bool | int]:
    """The ``-o`` options given to libfuse."""
    from burstctl.fuse_shim._fuse import LIBFUSE_VERSION

    # libfuse splits options at commas; a backslash escapes one in a value.
    fsname = f"burstctl:{config.backing}".replace("\\", "\\\\").replace(",", "\\,")
    options: dict[str, str | bool | int] = {
        "fsname": fsname,
        "subtype": "burstctl",
        "default_permissions": True,
    }
    if LIBFUSE_VERSION[0] == 2:
        # libfuse 3 refuses the option: the limit is set in init (PassthroughFS) there.
        options["max_write"] = config.max_write or FUSE2_MAX_WRITE
    if config.allow_other:
        options["allow_other"] = True
    if config.mountpoint == config.backing and LIBFUSE_VERSION[0] == 2:
        options["nonempty"] = True  # in place: the mount point holds the backing files
    # The user's last (refused ones never get this far: MountConfig checks them).
    options.update(config.fuse_option_items())
    return options


def run_mount(config: MountConfig) -> int:
    """Mounts and serves until unmounted; returns the process exit code.

    Without ``foreground`` the process forks first: the parent returns 0 once the child's
    mount answers (or the child's exit code if it fails), the child serves in its own session
    with stdio on /dev/null from then on (so logs go only to a log file, if one is set up).
    """
    config = validate(config)
    ready_fd: int | None = None
    if not config.foreground:
        read_end, ready_fd = os.pipe()
        pid = os.fork()
        if pid > 0:
            os.close(ready_fd)
            return _wait_ready(pid, read_end)
        os.close(read_end)
        os.setsid()
    return _serve(config, ready_fd, daemon=not config.foreground)


def _wait_ready(child: int, read_end: int) -> int:
    with os.fdopen(read_end, "rb") as ready:
        ok = ready.read(1) == b"1"
    if ok:
        return 0
    _, status = os.waitpid(child, 0)
    code = os.waitstatus_to_exitcode(status)
    return code if code > 0 else 1


def _serve(config: MountConfig, ready_fd: int | None, *, daemon: bool) -> int:
    from burstctl.fuse_shim._fuse import (
        LIBFUSE_VERSION,
        ConnectionAborted,
        KernelNotifier,
        MountFailed,
        serve,
    )
    from burstctl.fuse_shim.fs import PassthroughFS
    from burstctl.fuse_shim.inodes import InodeTable

    # Blocked before any thread starts: every thread (the client runtime's, libfuse's workers)
    # inherits the mask, so only the watcher receives these signals and libfuse's
    # own handlers never run.
    signal.pthread_sigmask(signal.SIG_BLOCK, _SHUTDOWN_SIGNALS)

    # The kernel applied the caller's umask to every mode it sends; ours must not apply again.
    os.umask(0)
    raise_open_file_limit()
    options = fuse_option_dict(config)
    root_fd = os.open(config.backing, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    runtime: ClientRuntime | None = None
    pacer: Pacer | None = None
    if not config.controller:
        logger.warning(
            "no --controller: I/O through %s is neither attributed nor paced (unthrottled)",
            config.mountpoint,
        )
    else:
        # One loop thread and one channel for the sessions of every job.
        runtime = ClientRuntime()
        pacer = Pacer(config, Attributor(config.attribution_ttl), runtime=runtime)
    # The kernel's caches, which the inode table asks to drop names past its budget and the
    # attributes of nodes the daemon changed on its own, while `serve` holds the session open.
    notifier = KernelNotifier()
    inodes = InodeTable(root_fd, config.max_handles, notifier)
    stage: StageOut | None = None
    if config.stage_out is not None or pacer is not None:
        # The jobs' files on the buffer (their space, reported to the controller) and, with
        # --stage-out, their drain to the PFS (docs/fuse.md, "Stage-out").
        stage = StageOut(
            root_fd,
            config.backing,
            config.stage_out,
            evict=config.evict_mode == "after-copy",
            hooks=pacer,
            path_of=inodes.path_of,
            changed=inodes.changed,
            journal=_journal(config, root_fd),
        )
        stage.start()
        if config.stage_out is not None:
            logger.info("staging out to %s (evict: %s)", config.stage_out, config.evict_mode)
    stopper = _Stopper(config.mountpoint, pacer)

    def on_init() -> None:
        stopper.mounted()
        if config.read_ahead:
            try:
                set_read_ahead(config.mountpoint, config.read_ahead)
            except OSError as err:
                logger.warning(
                    "read-ahead of %s left at the kernel's 128KiB (setting it needs root; "
                    "--read-ahead 0 does not try): %s",
                    config.mountpoint,
                    err,
                )
        logger.info(
            "mounted %s on %s (controller %s, fallback %s, libfuse %d.%d, direct I/O for %s)",
            config.backing,
            config.mountpoint,
            config.controller or "none",
            config.fallback,
            *LIBFUSE_VERSION,
            config.direct_io,
        )
        if daemon:
            _detach_stdio()  # first: the command returns with the terminal's pipes released
        if ready_fd is not None:
            with contextlib.suppress(OSError):
                os.write(ready_fd, b"1")
                os.close(ready_fd)

    fs = PassthroughFS(
        inodes,
        pacer,
        on_init=on_init,
        max_write=config.max_write,
        read_ahead=config.read_ahead,
        direct_io=config.direct_io,
        big_writes=config.big_writes,
        attr_timeout=config.attr_timeout,
        entry_timeout=config.entry_timeout,
        negative_timeout=config.negative_timeout,
        stage_out=stage,
    )
    logger.info("keeping up to %d inode handles open", inodes.budget)
    watcher = threading.Thread(target=stopper.watch, name="burstctl-signals", daemon=True)
    watcher.start()
    code = 0
    try:
        serve(fs, str(config.mountpoint), options, notifier, interruptible=pacer is not None)
    except MountFailed as err:
        logger.error("mounting %s failed (libfuse said why above): %s", config.mountpoint, err)
        code = 1
    except ConnectionAborted as err:
        if stopper.was_mounted and not _is_fuse_mount(config.mountpoint):
            # Once init has run, libfuse 2 ends its loop with an error only when reading
            # /dev/fuse fails with something other than ENODEV: the kernel closing the
            # connection while a worker takes a request off it ("reading device: Software
            # caused connection abort"). An unmount that completes as the last file closes
            # races the read of that file's RELEASE; so does an abort through fusectl. The
            # file system served until then and every write had been answered: a normal
            # end. (Still mounted would mean something else failed: reported as an error.)
            logger.warning(
                "the kernel closed the FUSE connection of %s while a request was being read "
                "(libfuse: %s); it had been unmounted",
                config.mountpoint,
                err,
            )
        else:
            logger.error("mounting %s failed (libfuse said why above): %s", config.mountpoint, err)
            code = 1
    finally:
        stopper.finished()
        if stage is not None:
            stage.stop()
        if pacer is not None:
            pacer.close()
        if runtime is not None:
            runtime.close()
        os.close(root_fd)
    if code == 0:
        logger.info("unmounted %s", config.mountpoint)
    return code


def _journal(config: MountConfig, root_fd: int) -> Journal | None:
    """The stage-out's journal of BACKING (``--journal``; none: no journal)."""
    if config.journal == "none":
        return None
    path = Path(config.journal) if config.journal else default_journal(config.backing)
    return Journal(path, root_fd)


class _Stopper:
    """The signal watcher: on SIGTERM/SIGINT/SIGHUP, release the pacer and unmount.

    A signal that arrives before the mount is up is remembered and acted on once it is.
    """

    def __init__(self, mountpoint: Path, pacer: Pacer | None) -> None:
        self._mountpoint = mountpoint
        self._pacer = pacer
        self._lock = threading.Lock()
        self._mounted = False
        self._requested = False
        self._done = threading.Event()

    def mounted(self) -> None:
        """Called from libfuse's init callback (a FUSE thread: must not wait on the mount)."""
        with self._lock:
            self._mounted = True
            act = self._requested
        if act:
            threading.Thread(target=self._stop, name="burstctl-stop", daemon=True).start()

    @property
    def was_mounted(self) -> bool:
        """Whether libfuse's init ran: the file system served requests."""
        with self._lock:
            return self._mounted

    def finished(self) -> None:
        self._done.set()

    def watch(self) -> None:
        while True:
            sig = signal.sigwait(_SHUTDOWN_SIGNALS)
            if self._done.is_set():
                return
            logger.info("%s: unmounting %s", signal.Signals(sig).name, self._mountpoint)
            with self._lock:
                self._requested = True
                act = self._mounted
            if act:
                self._stop()

    def _stop(self) -> None:
        if self._pacer is not None:
            # Blocked requests go through now; the sessions say Goodbye.
            self._pacer.close()
        try:
            unmount(self._mountpoint)
        except MountError as err:
            logger.warning("%s; detaching it lazily: it goes once its files are closed", err)
            try:
                unmount(self._mountpoint, lazy=True)
            except MountError as lazy_err:
                logger.error("%s", lazy_err)


def raise_open_file_limit() -> int:
    """Raises the soft open-file limit to the hard one (the mount keeps a handle per inode
    the kernel remembers); returns the soft limit now in force. The hard limit is the
    administrator's (systemd: ``LimitNOFILE``) and is left alone."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (OSError, ValueError) as err:
            logger.warning("could not raise the open-file limit from %d: %s", soft, err)
    return soft


def unmount(mountpoint: Path | str, *, lazy: bool = False, busy_grace: float = 1.0) -> None:
    """Unmounts a FUSE mount (``fusermount -u``, or umount2 as root); MountError on failure.

    A mount stays busy for a moment after its last file is closed (the kernel holds it until
    the daemon has answered the close), so "busy" is retried for ``busy_grace`` seconds.
    """
    deadline = time.monotonic() + busy_grace
    while True:
        try:
            _unmount_once(mountpoint, lazy)
            return
        except MountError as err:
            if "busy" not in str(err).lower() or time.monotonic() >= deadline:
                raise
        time.sleep(0.05)  # the next try, within the grace period above


def _unmount_once(mountpoint: Path | str, lazy: bool) -> None:
    path = os.path.realpath(mountpoint)
    tool = shutil.which("fusermount") or shutil.which("fusermount3")
    if tool is not None:
        cmd = [tool, "-u", *(["-z"] if lazy else []), path]
        result = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            message = result.stderr.strip() or f"{tool} exited with {result.returncode}"
            raise MountError(f"cannot unmount {path}: {message}")
        return
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    mnt_detach = 2
    if libc.umount2(os.fsencode(path), mnt_detach if lazy else 0) != 0:
        err = ctypes.get_errno()
        raise MountError(f"cannot unmount {path}: {os.strerror(err)}")


def _detach_stdio() -> None:
    """Points stdin, stdout and stderr of a daemonized mount at /dev/null."""
    devnull = os.open(os.devnull, os.O_RDWR)
    try:
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def run_unmount(mountpoint: Path, *, lazy: bool = False, echo: Callable[[str], None]) -> None:
    """``burstctl umount``: unmounts, or raises MountError with what went wrong."""
    path = Path(os.path.realpath(mountpoint))
    if not _is_fuse_mount(path):
        raise MountError(f"{mountpoint} is not a FUSE mount point")
    unmount(path, lazy=lazy)
    echo(f"unmounted {path}" + (" (lazily: it goes once its files are closed)" if lazy else ""))


def set_read_ahead(
    mountpoint: Path,
    nbytes: int,
    *,
    mountinfo: Path = Path("/proc/self/mountinfo"),
    bdi: Path = Path("/sys/class/bdi"),
) -> None:
    """Sets the kernel's read-ahead window for the FUSE mount on ``mountpoint``: the
    ``read_ahead_kb`` of its backing device info, which lives and dies with the mount.

    The kernel starts a FUSE mount at 128 KiB whatever libfuse asks for. With 1 MiB,
    sequential reads through libfuse 3's page cache path come in 1 MiB requests
    instead of 128 KiB ones (docs/benchmarks.md). Needs root (sysfs); raises OSError.
    The device is looked up in mountinfo, never by touching the mount (this runs
    inside the file system's own init). The last mount on ``mountpoint`` wins.
    """
    target = str(mountpoint)
    device = None
    with open(mountinfo, encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            fields = line.split()
            if len(fields) > 4 and _unescape(fields[4]) == target:
                device = fields[2]
    if device is None:
        raise FileNotFoundError(f"{mountpoint} is not in {mountinfo}")
    (bdi / device / "read_ahead_kb").write_text(f"{nbytes // 1024}\n", encoding="ascii")


def _unescape(field: str) -> str:
    """A path as /proc/self/mounts and mountinfo write it (octal escapes)."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def _is_fuse_mount(path: Path) -> bool:
    target = str(path)
    with open("/proc/self/mounts", encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            fields = line.split()
            if len(fields) < 3:
                continue
            if _unescape(fields[1]) == target and fields[2].startswith("fuse"):
                return True
    return False
