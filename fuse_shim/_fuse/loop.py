"""Mounting and serving: `serve` mounts a file system, runs libfuse's multithreaded loop until
the mount is gone, unmounts and frees the FUSE session (libfuse 2 and 3 each their own way).

`EntryNotifier` is how the file system asks the kernel to drop a cached name while a FUSE
session is up: `serve` opens it on its session and closes it before the session is unmounted
and freed, so that no request to the kernel ever reaches a freed session.
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


class EntryNotifier:
    """Asks the kernel to drop its cached (parent, name) entry, after which it forgets the
    inode unless it is in use (fuse_lowlevel_notify_inval_entry on the FUSE session, libfuse 3,
    or its channel, libfuse 2), for as long as `serve` holds the session open: -ENOTCONN
    before and after. Closing waits for an invalidation in flight, and none starts after it,
    so none reaches a session being freed. Thread-safe. ``notify`` is libfuse's function
    (tests give a stand-in)."""

    def __init__(self, notify: Callable[[int, int, bytes, int], int] | None = None) -> None:
        self._notify = notify if notify is not None else notify_inval_entry
        self._lock = threading.Lock()
        self._handle: int | None = None

    def open(self, handle: int) -> None:
        with self._lock:
            self._handle = handle

    def close(self) -> None:
        with self._lock:
            self._handle = None

    def invalidate_entry(self, parent: int, name: bytes) -> int:
        """0, or a negative errno (-ENOENT when the kernel had no such entry, -ENOTCONN when
        no session is open)."""
        with self._lock:
            if self._handle is None:
                return -errno.ENOTCONN
            return int(self._notify(self._handle, parent, name, len(name)))


def serve(
    fs: Operations,
    mountpoint: str,
    options: dict[str, str | bool | int],
    notifier: EntryNotifier | None = None,
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
    notifier = notifier if notifier is not None else EntryNotifier()
    if V3:
        _serve_v3(callbacks, ops, args, point, notifier)
    else:
        _serve_v2(callbacks, ops, args, point, notifier)
    del keep


def _serve_v3(
    callbacks: Callbacks, ops: Any, args: fuse_args, point: bytes, notifier: EntryNotifier
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
    callbacks: Callbacks, ops: Any, args: fuse_args, point: bytes, notifier: EntryNotifier
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
    notifier.open(chan)
    add_chan(fuse_session, chan)
    try:
        result = loop(fuse_session)
    finally:
        notifier.close()
        remove_chan(chan)
        destroy(fuse_session)
        unmount(point, chan)
    if result != 0:
        raise ConnectionAborted(f"libfuse's loop ended with {result}")
