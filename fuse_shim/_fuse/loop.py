"""Mounting and serving: `serve` mounts a file system, runs libfuse's multithreaded loop until
the mount is gone, unmounts and frees the FUSE session (libfuse 2 and 3 each their own way).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Iterable
from typing import Any

from burstctl.fuse_shim._fuse.callbacks import Callbacks
from burstctl.fuse_shim._fuse.lowlevel import (
    V3,
    bind,
    fuse_args,
    fuse_lowlevel_ops,
    lib,
    notify_inval_entry,
)
from burstctl.fuse_shim._fuse.operations import Operations


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


def serve(fs: Operations, mountpoint: str, options: dict[str, str | bool | int]) -> None:
    """Mounts ``fs`` on ``mountpoint`` and serves it with libfuse's multithreaded loop until
    it is unmounted; then frees the FUSE session. Raises `MountFailed` when libfuse cannot mount
    and `ConnectionAborted` when the loop ends on an error."""
    ops = fuse_lowlevel_ops()
    callbacks = Callbacks(fs, ops)
    args, keep = _args(["burstctl", *option_args(options)])
    point = os.fsencode(mountpoint)
    if V3:
        _serve_v3(callbacks, ops, args, point)
    else:
        _serve_v2(callbacks, ops, args, point)
    del keep


def _invalidator(handle: int) -> Callable[[int, bytes], int]:
    """fuse_lowlevel_notify_inval_entry on the FUSE session (libfuse 3) or channel (libfuse 2):
    0, or a negative errno (-ENOENT when the kernel had no such entry)."""

    def invalidate(parent: int, name: bytes) -> int:
        return int(notify_inval_entry(handle, parent, name, len(name)))

    return invalidate


def _serve_v3(callbacks: Callbacks, ops: Any, args: fuse_args, point: bytes) -> None:
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
    unmount = bind("fuse_session_unmount", None, ctypes.c_void_p, lib=lib)
    destroy = bind("fuse_session_destroy", None, ctypes.c_void_p, lib=lib)
    fuse_session = new(ctypes.byref(args), ctypes.byref(ops), ctypes.sizeof(ops), None)
    if not fuse_session:
        raise MountFailed("libfuse refused the options")
    callbacks.fuse_session = fuse_session
    callbacks.fs.invalidate_entry = _invalidator(fuse_session)
    try:
        if mount(fuse_session, point) != 0:
            raise MountFailed(f"cannot mount {os.fsdecode(point)}")
        try:
            result = loop(fuse_session, None)
        finally:
            callbacks.fs.invalidate_entry = None
            unmount(fuse_session)
        if result != 0:
            raise ConnectionAborted(f"libfuse's loop ended with {result}")
    finally:
        destroy(fuse_session)


def _serve_v2(callbacks: Callbacks, ops: Any, args: fuse_args, point: bytes) -> None:
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
    callbacks.fs.invalidate_entry = _invalidator(chan)
    add_chan(fuse_session, chan)
    try:
        result = loop(fuse_session)
    finally:
        callbacks.fs.invalidate_entry = None
        remove_chan(chan)
        destroy(fuse_session)
        unmount(point, chan)
    if result != 0:
        raise ConnectionAborted(f"libfuse's loop ended with {result}")
