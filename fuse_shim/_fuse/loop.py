"""Mounting and serving: `serve` mounts a file system, runs libfuse's multithreaded loop until
the mount is gone, unmounts and frees the FUSE session (libfuse 2 and 3 each their own way).

`KernelNotifier` is how the file system asks the kernel to drop a cached name, or an inode's
cached attributes and pages, while a FUSE session is up: `serve` opens it on its session and
closes it before the session is unmounted and freed, so that no notification ever reaches a
freed session.
"""

from __future__ import annotations

import ctypes
import errno
import os
import threading
from collections.abc import Callable, Iterable
from typing import Any

from burstctl.fuse_shim._fuse.callbacks import Callbacks, Interrupts
from burstctl.fuse_shim._fuse.lowlevel import (
    V3,
    bind,
    fuse_args,
    fuse_lowlevel_ops,
    lib,
    notify_inval_entry,
    notify_inval_inode,
)
from burstctl.fuse_shim._fuse.operations import Operations

# libfuse 3's bound on a loop's worker threads (FUSE_LOOP_MT_MAX_THREADS).
_MAX_THREADS = 100_000


def _args(argv: Iterable[str]) -> tuple[fuse_args, Any]:
    encoded = [os.fsencode(arg) for arg in argv]
    array = (ctypes.c_char_p * (len(encoded) + 1))(*encoded, None)
    return fuse_args(len(encoded), array, 0), array


def option_args(options: dict[str, str | bool | int]) -> list[str]:
    """``-o`` arguments for libfuse from ``{name: value}`` (True: the bare flag)."""
    items = [name if value is True else f"{name}={value}" for name, value in options.items()]
    return ["-o", ",".join(items)] if items else []


class MountFailed(RuntimeError):
    """libfuse could not mount (it printed why on stderr)."""


class ConnectionAborted(RuntimeError):
    """libfuse's loop ended on an error reading /dev/fuse (not on the mount going away)."""


class KernelNotifier:
    """Tells the kernel to drop what it cached while a FUSE session is up: a (parent, name)
    entry (`invalidate_entry`, libfuse's ``fuse_lowlevel_notify_inval_entry``) or an inode's
    attributes and pages (`invalidate_inode`, ``fuse_lowlevel_notify_inval_inode``), on the
    FUSE session (libfuse 3) or its channel (libfuse 2), for as long as `serve` holds the
    session open: -ENOTCONN before and after. Closing waits for the notifications in flight,
    and none starts after it, so none reaches a session being freed. Thread-safe; calls run
    side by side (one that waits in the kernel for a directory's lock holds up no other).
    ``notify_entry``, ``notify_inode``: libfuse's functions (tests give stand-ins)."""

    def __init__(
        self,
        notify_entry: Callable[[int, int, bytes, int], int] | None = None,
        notify_inode: Callable[[int, int, int, int], int] | None = None,
    ) -> None:
        self._notify_entry = notify_entry if notify_entry is not None else notify_inval_entry
        self._notify_inode = notify_inode if notify_inode is not None else notify_inval_inode
        self._idle = threading.Condition()
        self._handle: int | None = None
        self._in_flight = 0

    def open(self, handle: int) -> None:
        with self._idle:
            self._handle = handle

    def close(self) -> None:
        with self._idle:
            self._handle = None
            self._idle.wait_for(lambda: self._in_flight == 0)

    def _call(self, notify: Callable[..., int], *args: object) -> int:
        with self._idle:
            handle = self._handle
            if handle is None:
                return -errno.ENOTCONN
            self._in_flight += 1
        try:
            return int(notify(handle, *args))
        finally:
            with self._idle:
                self._in_flight -= 1
                if self._in_flight == 0:
                    self._idle.notify_all()

    def invalidate_entry(self, parent: int, name: bytes) -> int:
        """Drops the kernel's (parent, name) entry, after which it forgets the inode unless it
        is in use. 0, or a negative errno (-ENOENT when the kernel had no such entry,
        -ENOTCONN when no session is open). The kernel takes the parent directory's lock:
        never call it from a request on that directory."""
        return self._call(self._notify_entry, parent, name, len(name))

    def invalidate_inode(self, node: int, offset: int = -1, length: int = 0) -> int:
        """Drops the kernel's cached attributes of ``node`` (its next ``stat`` asks the
        daemon), and with ``offset`` >= 0 its cached pages from there (``length`` bytes, 0:
        to the end). 0, or a negative errno (-ENOENT when the kernel does not know the node,
        -ENOTCONN when no session is open).

        Attributes only (``offset`` < 0) may be asked from within a request on the same
        inode, a write's included: the kernel (``fuse_reverse_inval_inode``, fs/fuse/inode.c)
        then only finds the inode, bumps its attribute version under the inode's spinlock and
        marks its attributes stale; it takes no lock a request in progress holds (not the
        inode's ``i_rwsem``, nor a page lock), and a GETATTR answer already under way with
        the old attributes is discarded by the version check. Pages are another matter: the
        kernel locks each cached page of the range, and a read or write through the page
        cache holds its pages locked until the daemon answers. So a data range must never be
        asked from a request handler, nor by a thread holding anything a handler may wait
        for."""
        return self._call(self._notify_inode, node, offset, length)


def serve(
    fs: Operations,
    mountpoint: str,
    options: dict[str, str | bool | int],
    notifier: KernelNotifier | None = None,
    *,
    interruptible: bool = True,
) -> None:
    """Mounts ``fs`` on ``mountpoint`` and serves it with libfuse's multithreaded loop until
    it is unmounted; then frees the FUSE session. ``notifier`` is open on the session while it
    is mounted. ``interruptible``: requests may wait, and run under a cancellation that their
    interrupt fires (`Interrupts`; False saves its cost per request where nothing waits).
    Raises `MountFailed` when libfuse cannot mount and `ConnectionAborted` when the loop ends
    on an error."""
    ops = fuse_lowlevel_ops()
    callbacks = Callbacks(fs, ops, Interrupts() if interruptible else None)
    args, keep = _args(["burstctl", *option_args(options)])
    point = os.fsencode(mountpoint)
    notifier = notifier if notifier is not None else KernelNotifier()
    if V3:
        _serve_v3(callbacks, ops, args, point, notifier)
    else:
        _serve_v2(callbacks, ops, args, point, notifier)
    del keep


def _serve_v3(
    callbacks: Callbacks, ops: Any, args: fuse_args, point: bytes, notifier: KernelNotifier
) -> None:
    new = bind(
        "fuse_session_new",
        ctypes.c_void_p,
        ctypes.POINTER(fuse_args),
        ctypes.POINTER(fuse_lowlevel_ops),
        ctypes.c_size_t,
        ctypes.c_void_p,
        lib=lib,
    )
    mount = bind("fuse_session_mount", ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, lib=lib)
    loop = bind("fuse_session_loop_mt_312", ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, lib=lib)
    config_create = bind("fuse_loop_cfg_create", ctypes.c_void_p, lib=lib)
    set_max_threads = bind(
        "fuse_loop_cfg_set_max_threads", None, ctypes.c_void_p, ctypes.c_uint, lib=lib
    )
    config_destroy = bind("fuse_loop_cfg_destroy", None, ctypes.c_void_p, lib=lib)
    unmount = bind("fuse_session_unmount", None, ctypes.c_void_p, lib=lib)
    destroy = bind("fuse_session_destroy", None, ctypes.c_void_p, lib=lib)
    fuse_session = new(ctypes.byref(args), ctypes.byref(ops), ctypes.sizeof(ops), None)
    if not fuse_session:
        raise MountFailed("libfuse refused the options")
    callbacks.fuse_session = fuse_session
    notifier.open(fuse_session)
    try:
        if mount(fuse_session, point) != 0:
            raise MountFailed(f"cannot mount {os.fsdecode(point)}")
        # Each request that waits (pacing, space) holds a worker thread; libfuse 3 starts at
        # most 10 by default, after which nothing reads /dev/fuse, not even the interrupts
        # that would end those waits. As many as libfuse allows, as libfuse 2 does.
        config = config_create()
        set_max_threads(config, _MAX_THREADS)
        try:
            result = loop(fuse_session, config)
        finally:
            config_destroy(config)
            notifier.close()
            unmount(fuse_session)
        if result != 0:
            raise ConnectionAborted(f"libfuse's loop ended with {result}")
    finally:
        notifier.close()
        destroy(fuse_session)


def _serve_v2(
    callbacks: Callbacks, ops: Any, args: fuse_args, point: bytes, notifier: KernelNotifier
) -> None:
    mount = bind("fuse_mount", ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(fuse_args), lib=lib)
    new = bind(
        "fuse_lowlevel_new",
        ctypes.c_void_p,
        ctypes.POINTER(fuse_args),
        ctypes.POINTER(fuse_lowlevel_ops),
        ctypes.c_size_t,
        ctypes.c_void_p,
        lib=lib,
    )
    add_chan = bind("fuse_session_add_chan", None, ctypes.c_void_p, ctypes.c_void_p, lib=lib)
    remove_chan = bind("fuse_session_remove_chan", None, ctypes.c_void_p, lib=lib)
    loop = bind("fuse_session_loop_mt", ctypes.c_int, ctypes.c_void_p, lib=lib)
    destroy = bind("fuse_session_destroy", None, ctypes.c_void_p, lib=lib)
    unmount = bind("fuse_unmount", None, ctypes.c_char_p, ctypes.c_void_p, lib=lib)
    chan = mount(point, ctypes.byref(args))
    if not chan:
        raise MountFailed(f"cannot mount {os.fsdecode(point)}")
    fuse_session = new(ctypes.byref(args), ctypes.byref(ops), ctypes.sizeof(ops), None)
    if not fuse_session:
        unmount(point, chan)
        raise MountFailed("libfuse refused the options")
    callbacks.fuse_session = fuse_session
    add_chan(fuse_session, chan)
    # Only once the channel has its session: libfuse 2's notify functions reach the session
    # through the channel, and would follow a null pointer before.
    notifier.open(chan)
    try:
        result = loop(fuse_session)
    finally:
        notifier.close()
        remove_chan(chan)
        destroy(fuse_session)
        unmount(point, chan)
    if result != 0:
        raise ConnectionAborted(f"libfuse's loop ended with {result}")
