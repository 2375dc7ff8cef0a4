"""A minimal node agent for the preload library's tests, built on `JobPage`.

It answers the library's protocol (docs/preload.md; preload_shim/page.py) on a real
``AF_UNIX``/``SOCK_SEQPACKET`` socket: ``ATTACH 1`` gets ``OK 1 <job>`` with the page's memfd
and eventfd; ``PATHS`` and ``STATUS`` as the real agent answers them. One page for every
process (one job), whose rate the test sets; a heartbeat thread keeps it alive until
`stop_beating`. It records each attach with the peer's pid (``SO_PEERCRED``) and sees each
connection's EOF. It runs in threads of the test process and is stopped by `close`.
"""

from __future__ import annotations

import json
import os
import selectors
import socket
import struct
import threading
from dataclasses import asdict
from pathlib import Path

from burstctl.preload_shim.page import JobPage


class FakeAgent:
    def __init__(self, socket_path: Path, paths: list[str], job_id: str = "job-1") -> None:
        self.socket_path = socket_path
        self.paths = paths
        self.job_id = job_id
        self.page = JobPage("fake-agent-page")
        self.refuse: str | None = None  # when set, ATTACH gets "NO <refuse>"
        self.page_fd: int | None = None  # when set, ATTACH hands this fd instead of the page's
        self.attaches: list[int] = []  # peer pids, in order
        self.closed_pids: list[int] = []  # peers whose attached connection saw EOF
        self.old_pages: list[JobPage] = []
        self._lock = threading.Lock()
        self._conns: dict[socket.socket, int] = {}
        self._attached: set[socket.socket] = set()
        self._sel = selectors.DefaultSelector()
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        self._server.bind(str(socket_path))
        os.chmod(socket_path, 0o666)
        self._server.listen(64)
        self._server.setblocking(False)
        self._sel.register(self._server, selectors.EVENT_READ)
        self._stop = threading.Event()
        self._beating = threading.Event()
        self._beating.set()
        self._threads = [
            threading.Thread(target=self._serve, name="fake-agent", daemon=True),
            threading.Thread(target=self._beat, name="fake-agent-beat", daemon=True),
        ]
        for t in self._threads:
            t.start()

    # ------------------------------------------------------------------ controls

    def publish(self, rate: float, burst: float = 1 << 20) -> None:
        with self._lock:
            self.page.publish(rate, burst)

    def stop_beating(self) -> None:
        self._beating.clear()

    def replace_page(self, rate: float, burst: float = 1 << 20) -> JobPage:
        """Marks the page closed and serves later attaches with a new one at ``rate``."""
        with self._lock:
            old = self.page
            old.mark_closed()
            self.old_pages.append(old)
            self.page = JobPage("fake-agent-page")
            self.page.publish(rate, burst)
            return self.page

    def snapshot(self) -> tuple[list[int], list[int]]:
        with self._lock:
            return list(self.attaches), list(self.closed_pids)

    def close(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=5)
        for conn in list(self._conns):
            conn.close()
        self._sel.close()
        self._server.close()
        self.socket_path.unlink(missing_ok=True)
        for page in [*self.old_pages, self.page]:
            page.close()

    # ------------------------------------------------------------------ threads

    def _beat(self) -> None:
        while not self._stop.wait(0.05):
            if self._beating.is_set():
                with self._lock:
                    self.page.beat()

    def _serve(self) -> None:
        while not self._stop.is_set():
            for key, _ in self._sel.select(timeout=0.05):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                if sock is self._server:
                    self._accept()
                else:
                    self._answer(sock)

    def _accept(self) -> None:
        try:
            conn, _ = self._server.accept()
        except BlockingIOError:
            return
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        pid, _uid, _gid = struct.unpack("3i", creds)
        self._conns[conn] = pid
        self._sel.register(conn, selectors.EVENT_READ)

    def _answer(self, conn: socket.socket) -> None:
        try:
            msg = conn.recv(4096)
        except OSError:
            msg = b""
        pid = self._conns[conn]
        if not msg:  # EOF: that process image is done
            self._sel.unregister(conn)
            del self._conns[conn]
            with self._lock:
                if conn in self._attached:
                    self._attached.discard(conn)
                    self.closed_pids.append(pid)
            conn.close()
            return
        text = msg.decode(errors="replace")
        if text == "ATTACH 1":
            with self._lock:
                if self.refuse is not None:
                    conn.send(f"NO {self.refuse}".encode())
                    return
                page = self.page
                page_fd = page.fd if self.page_fd is None else self.page_fd
                socket.send_fds(conn, [f"OK 1 {self.job_id}".encode()], [page_fd, page.eventfd])
                self.attaches.append(pid)
                self._attached.add(conn)
        elif text == "PATHS":
            conn.send(("PATHS " + ":".join(self.paths)).encode())
        elif text == "STATUS":
            with self._lock:
                status = {
                    "jobs": {self.job_id: asdict(self.page.counters())},
                    "connections": {str(p): self.job_id for p in self.attaches},
                }
            conn.send(("STATUS " + json.dumps(status)).encode())
        else:
            conn.send(b"NO unknown request")
