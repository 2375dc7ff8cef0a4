"""The agent's Unix socket: where it lives, who is on the other end, and the messages.

AF_UNIX ``SOCK_SEQPACKET``: one message is one request or one answer, no framing. The socket
file is mode 0666 in a 0755 directory, so any local process may connect; the agent decides
everything from the peer's ``SO_PEERCRED`` (pid, uid, gid), which the kernel fills in at
``connect`` and a process cannot forge (docs/preload.md, "Trust model").

Requests and answers (the contract with the library, preload_shim/page.py):

- ``ATTACH 1`` → ``OK 1 <job id>`` with two fds by ``SCM_RIGHTS`` (the job's page memfd,
  its eventfd), or ``NO <reason>``; the connection then stays open for the process's life.
- ``OPEN <flags>`` with the descriptor a paced open returned → ``OK``, ``SKIP``, ``PFS`` with
  the descriptor of an evicted file's PFS copy, or ``EIO <reason>``; ``CLOSE`` with a told
  descriptor, before it is closed → no answer (preload_shim/stage.c, `staging.AgentStage`);
  each on a connection of its own.
- ``PATHS`` → ``PATHS <dir>:<dir>...``; ``STATUS`` → ``STATUS <json>``.
- anything else → ``NO unknown request``.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import socket
import stat
import struct
from pathlib import Path

from burstctl.node.attribution import Caller
from burstctl.preload_shim.config import AgentError

logger = logging.getLogger(__name__)

ATTACH = b"ATTACH 1"
PROTOCOL = 1
# The largest request read; answers (STATUS) may be longer.
MAX_REQUEST = 4096
SOCKET_MODE = 0o666
DIR_MODE = 0o755


def peer_of(conn: socket.socket) -> Caller:
    """The credentials of the process at the other end (as of its ``connect``)."""
    raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return Caller(pid, uid, gid)


def listen(path: Path) -> socket.socket:
    """Binds and listens on ``path``: makes its directory (0755) if missing, removes a stale
    socket file, refuses one a live agent answers on (`AgentError`); the socket is 0666."""
    directory = path.parent
    try:
        if not directory.is_dir():
            directory.mkdir(parents=True, mode=DIR_MODE)
            directory.chmod(DIR_MODE)  # not narrowed by the umask
    except OSError as err:
        raise AgentError(f"--socket: cannot create {str(directory)!r}: {err.strerror}") from None
    try:
        st = path.lstat()
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISSOCK(st.st_mode):
            raise AgentError(f"--socket: {str(path)!r} exists and is not a socket")
        if _answers(path):
            raise AgentError(f"--socket: an agent already listens on {str(path)!r}")
        path.unlink()
        logger.info("removed the stale socket %s (left by an agent that died)", path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    try:
        sock.bind(str(path))
        os.chmod(path, SOCKET_MODE)
        sock.listen(128)
        sock.setblocking(False)
    except OSError as err:
        sock.close()
        raise AgentError(f"--socket: cannot listen on {str(path)!r}: {err.strerror}") from None
    return sock


def _answers(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC) as probe:
        try:
            probe.connect(str(path))
        except OSError as err:
            if err.errno in (errno.ECONNREFUSED, errno.ENOENT):
                return False
            raise AgentError(f"--socket: cannot check {str(path)!r}: {err.strerror}") from None
        return True


def request(path: str | Path, message: bytes, timeout: float = 5.0) -> bytes:
    """One request to the agent at ``path`` and its answer (OSError when unreachable)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC) as sock:
        sock.settimeout(timeout)
        sock.connect(str(path))
        sock.send(message)
        answer = sock.recv(1 << 20)
        if not answer:
            raise ConnectionResetError(errno.ECONNRESET, "the agent closed the connection")
        return answer


async def receive(
    loop: asyncio.AbstractEventLoop, conn: socket.socket, max_fds: int
) -> tuple[bytes, list[int]]:
    """The next message on the non-blocking ``conn`` and the descriptors it carried (b"" at
    EOF); OSError when the connection fails."""
    while True:
        try:
            message, fds, flags, _ = socket.recv_fds(conn, MAX_REQUEST, max_fds)
        except (BlockingIOError, InterruptedError):
            ready = loop.create_future()
            loop.add_reader(conn.fileno(), ready.set_result, None)
            try:
                await ready
            finally:
                loop.remove_reader(conn.fileno())
            continue
        if flags & socket.MSG_CTRUNC:
            for fd in fds:
                os.close(fd)
            fds = []
        return message, fds


def send(conn: socket.socket, message: bytes, fds: tuple[int, ...] = ()) -> bool:
    """Sends one message (with ``fds``); False when the peer is gone or would block."""
    with contextlib.suppress(OSError):
        if fds:
            socket.send_fds(conn, [message], list(fds))
        else:
            conn.send(message)
        return True
    return False
