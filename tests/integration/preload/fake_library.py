"""A Python stand-in for the preload library's side of the agent protocol (docs/preload.md).

Run as a child process (so the agent sees its own pid, uid and environment through
SO_PEERCRED and /proc): ``python fake_library.py SOCKET``. It attaches like the library
(``ATTACH 1`` over SOCK_SEQPACKET, the page memfd and eventfd by SCM_RIGHTS, the page mapped
MAP_SHARED, magic and version checked), then obeys one command a line on stdin and answers one
line on stdout:

- ``attach`` → ``ok <job id>`` or ``no <reason>`` (the agent's refusal or a failure);
- ``write N`` / ``read N`` → reserves N tokens from the page and waits for them as the library
  does (a waiter while it waits, the eventfd written by the first waiter), bumps the req_*,
  calls_* and moved_* counters → ``ok <seconds waited>``;
- ``flat SECONDS CHUNK`` → paced writes of CHUNK bytes, flat out, for SECONDS →
  ``ok <bytes moved> <seconds taken>``;
- ``ask N`` → only bumps req_write by N (bytes asked for, not waited for) → ``ok``;
- ``hold`` / ``unhold`` → one waiter more / less, the eventfd written on 0 → 1 → ``ok``
  (the wait beat is stamped once: the agent counts the waiter for `WAIT_STALE_NS`);
- ``rate`` → ``ok <rate> <burst> <flags> <heartbeat age s>``;
- ``poke OFFSET VALUE`` → writes an i64 anywhere in the page (a hostile process) → ``ok``.

One thread: the reservation needs no compare-and-swap here.
"""

from __future__ import annotations

import ctypes
import math
import mmap
import os
import socket
import sys
import time

# The layout, as preload_shim/page.py documents it (read here from the contract itself).
from burstctl.preload_shim import page as layout


class Page:
    def __init__(self, fd: int, eventfd: int) -> None:
        self.map = mmap.mmap(fd, layout.PAGE_SIZE, mmap.MAP_SHARED)
        self.eventfd = eventfd
        magic = ctypes.c_uint32.from_buffer(self.map, layout.OFF_MAGIC).value
        version = ctypes.c_uint32.from_buffer(self.map, layout.OFF_VERSION).value
        if magic != layout.MAGIC or version != layout.VERSION:
            raise ValueError(f"bad page: magic {magic:#x} version {version}")

    def i64(self, off: int) -> ctypes.c_int64:
        return ctypes.c_int64.from_buffer(self.map, off)

    def supply(self) -> tuple[float, int, int]:
        """(filled now, burst, flags), read under the seqlock."""
        while True:
            seq = ctypes.c_uint64.from_buffer(self.map, layout.OFF_SEQ).value
            if seq % 2:
                continue
            t0 = self.i64(layout.OFF_T0).value
            filled0 = self.i64(layout.OFF_FILLED0).value
            rate = ctypes.c_double.from_buffer(self.map, layout.OFF_RATE).value
            burst = self.i64(layout.OFF_BURST).value
            if ctypes.c_uint64.from_buffer(self.map, layout.OFF_SEQ).value == seq:
                break
        flags = ctypes.c_uint32.from_buffer(self.map, layout.OFF_FLAGS).value
        if rate == math.inf:
            return math.inf, burst, flags
        now = layout.monotonic_ns()
        return filled0 + rate * max(0, now - t0) / 1e9, burst, flags

    def add(self, off: int, n: int) -> int:
        cell = self.i64(off)
        cell.value += n
        return cell.value

    def beat(self) -> int:
        """Stamps the page's wait beat (a waiter is alive); the beat it replaced."""
        cell = self.i64(layout.OFF_WAIT_BEAT)
        before, cell.value = cell.value, layout.monotonic_ns()
        return before

    def hold(self, n: int) -> None:
        stale = n > 0 and layout.monotonic_ns() - self.beat() >= layout.WAIT_STALE_NS
        if (self.add(layout.OFF_WAITERS, n) == 1 or stale) and n > 0:
            os.eventfd_write(self.eventfd, 1)

    def paced(self, kind: str, n: int, dead_after: float = 2.0) -> float:
        self.add(layout.OFF_REQ_READ if kind == "read" else layout.OFF_REQ_WRITE, n)
        self.add(layout.OFF_CALLS_READ if kind == "read" else layout.OFF_CALLS_WRITE, 1)
        filled, burst, _ = self.supply()
        taken = self.i64(layout.OFF_TAKEN)
        target = max(taken.value, (filled - burst) if filled != math.inf else 0) + n
        taken.value = int(target)
        waited = 0.0
        if filled < target:
            self.add(layout.OFF_WAITS, 1)
            self.hold(1)
            start = time.monotonic()
            try:
                while True:
                    filled, _, flags = self.supply()
                    age = (layout.monotonic_ns() - self.i64(layout.OFF_HEARTBEAT).value) / 1e9
                    if filled >= target or flags & layout.FLAG_CLOSED or age > dead_after:
                        break
                    time.sleep(0.002)  # the library's wait slice
                    self.beat()
            finally:
                waited = time.monotonic() - start
                self.add(layout.OFF_WAIT_NS, int(waited * 1e9))
                self.hold(-1)
        self.add(layout.OFF_MOVED_READ if kind == "read" else layout.OFF_MOVED_WRITE, n)
        return waited


def attach(path: str) -> tuple[socket.socket, Page | None, str]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    sock.settimeout(5)
    sock.connect(path)
    sock.send(b"ATTACH 1")
    message, fds, _, _ = socket.recv_fds(sock, 4096, 2)
    words = message.decode().split(" ", 2)
    if words[0] != "OK":
        for fd in fds:
            os.close(fd)
        return sock, None, message.decode()
    assert words[1] == "1" and len(fds) == 2, (message, fds)
    page = Page(fds[0], fds[1])  # the memfd stays open: the security test looks for it
    return sock, page, words[2]


def main() -> None:
    path = sys.argv[1]
    page: Page | None = None
    conn: socket.socket | None = None
    for line in sys.stdin:
        cmd, *args = line.split()
        if cmd == "attach":
            conn, page, answer = attach(path)
            print(("ok " + answer) if page is not None else ("no " + answer), flush=True)
            continue
        assert page is not None, "attach first"
        if cmd in ("write", "read"):
            print(f"ok {page.paced(cmd, int(args[0])):.6f}", flush=True)
        elif cmd == "flat":
            seconds, chunk = float(args[0]), int(args[1])
            moved, start = 0, time.monotonic()
            while time.monotonic() - start < seconds:
                page.paced("write", chunk)
                moved += chunk
            print(f"ok {moved} {time.monotonic() - start:.6f}", flush=True)
        elif cmd == "ask":
            page.add(layout.OFF_REQ_WRITE, int(args[0]))
            print("ok", flush=True)
        elif cmd == "hold":
            page.hold(1)
            print("ok", flush=True)
        elif cmd == "unhold":
            page.hold(-1)
            print("ok", flush=True)
        elif cmd == "rate":
            rate = ctypes.c_double.from_buffer(page.map, layout.OFF_RATE).value
            _, burst, flags = page.supply()
            age = (layout.monotonic_ns() - page.i64(layout.OFF_HEARTBEAT).value) / 1e9
            print(f"ok {rate!r} {burst} {flags} {age:.6f}", flush=True)
        elif cmd == "poke":
            page.i64(int(args[0])).value = int(args[1])
            print("ok", flush=True)
        else:
            print(f"no unknown command {cmd}", flush=True)
    if conn is not None:
        conn.close()


if __name__ == "__main__":
    main()
