"""The C-callable callbacks of one mount, and the errno barrier around each.

`Callbacks` fills a `fuse_lowlevel_ops` with one thin wrapper per operation the file system
implements: it calls the file system's method (`operations.Operations`), sends the reply, and
turns an `OSError` into its errno; anything else is logged and answered EIO. Nothing ever
raises into libfuse: a bug fails one request, never the mount. A reply the kernel did not take
(the caller was interrupted) gives back what the reply handed over (a lookup's reference, an
open's handle).

With `Interrupts` (a mount whose requests may wait), every request but init, destroy and the
forgets runs under a `Cancellation` of its own (`burstctl.client.waits`), fired when the
kernel interrupts the request: a wait of the request's thread (pacing, space on the burst
buffer, a session's attach) then ends at once with `Interrupted`, which the barrier answers
EINTR (docs/fuse.md, "Interrupted requests").
"""

from __future__ import annotations

import ctypes
import errno
import itertools
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from burstctl.client.waits import Cancellation
from burstctl.fuse_shim._fuse.lowlevel import (
    SET_ATTR_ATIME,
    SET_ATTR_ATIME_NOW,
    SET_ATTR_GID,
    SET_ATTR_MODE,
    SET_ATTR_MTIME,
    SET_ATTR_MTIME_NOW,
    SET_ATTR_SIZE,
    SET_ATTR_UID,
    V3,
    add_direntry_plus,
    c_stat,
    c_statvfs,
    fuse_entry_param,
    fuse_lowlevel_ops,
    interrupt_func_t,
    reply_attr,
    reply_buf,
    reply_create,
    reply_entry,
    reply_err,
    reply_lseek,
    reply_none,
    reply_open,
    reply_readlink,
    reply_statfs,
    reply_write,
    reply_xattr,
    req_interrupt_func,
)
from burstctl.fuse_shim._fuse.operations import NOW, Entry, Opened, Operations, SetAttr

logger = logging.getLogger(__name__)


def _fill_stat(out: Any, st: os.stat_result) -> None:
    out.st_dev = st.st_dev
    out.st_ino = st.st_ino
    out.st_nlink = st.st_nlink
    out.st_mode = st.st_mode
    out.st_uid = st.st_uid
    out.st_gid = st.st_gid
    out.st_rdev = st.st_rdev
    out.st_size = st.st_size
    out.st_blksize = st.st_blksize
    out.st_blocks = st.st_blocks
    out.st_atimespec.tv_sec, out.st_atimespec.tv_nsec = divmod(st.st_atime_ns, 1_000_000_000)
    out.st_mtimespec.tv_sec, out.st_mtimespec.tv_nsec = divmod(st.st_mtime_ns, 1_000_000_000)
    out.st_ctimespec.tv_sec, out.st_ctimespec.tv_nsec = divmod(st.st_ctime_ns, 1_000_000_000)


def _time_ns(spec: Any) -> int:
    return int(spec.tv_sec) * 1_000_000_000 + int(spec.tv_nsec)


class _Buffers(threading.local):
    """A read buffer per libfuse worker thread, grown to the largest request seen."""

    def __init__(self) -> None:
        self.buffer = ctypes.create_string_buffer(0)
        self.view = memoryview(self.buffer).cast("B")

    def get(self, size: int) -> tuple[Any, memoryview]:
        if len(self.buffer) < size:
            self.buffer = ctypes.create_string_buffer(size)
            self.view = memoryview(self.buffer).cast("B")
        return self.buffer, self.view[:size]


def _view(address: int | None, size: int) -> memoryview:
    """A view of ``size`` bytes of libfuse's memory at ``address`` (no copy)."""
    if size == 0 or address is None:
        return memoryview(b"")
    return memoryview((ctypes.c_char * size).from_address(address)).cast("B")


_PyGILState_Ensure = ctypes.pythonapi.PyGILState_Ensure
_PyGILState_Ensure.restype = ctypes.c_int
_PyGILState_Ensure.argtypes = []
_pins = threading.local()


def _pinned(method: Callable[..., None]) -> Callable[..., None]:
    """``method``, keeping the Python thread state of the libfuse worker that calls it.

    ctypes enters a callback on a thread Python did not start with ``PyGILState_Ensure`` and
    leaves it with ``PyGILState_Release``, which creates and destroys a thread state each
    time: on Python 3.11 that is an mmap and a munmap of its frame stack per request, and
    every munmap in a multithreaded process shoots down TLBs on the other CPUs. One extra
    ``PyGILState_Ensure`` per worker thread (never released) keeps its thread state alive.
    """

    def call(*args: Any) -> None:
        if not getattr(_pins, "pinned", False):
            _PyGILState_Ensure()  # the GIL is held here: this only counts one more user
            _pins.pinned = True
        method(*args)

    return call


# The callbacks that answer no request (init, destroy) or cannot wait (forgets): no cancellation.
_NOT_INTERRUPTIBLE = frozenset({"init", "destroy", "forget", "forget_multi"})


class _Request(Cancellation):
    """One request's cancellation: armed, it registers the request's interrupt with libfuse."""

    __slots__ = ("_interrupts", "number", "req")

    def __init__(self, interrupts: Interrupts, req: int) -> None:
        super().__init__()
        self._interrupts = interrupts
        self.req = req
        self.number = 0  # names the request to its interrupt function, once armed

    def arm(self) -> None:
        self._interrupts.register(self)


class Interrupts:
    """The requests' cancellations, fired by the kernel's interrupts (FUSE_INTERRUPT).

    A request's `Cancellation` is registered with libfuse (``fuse_req_interrupt_func``) only
    when a wait of its thread is about to block, so a request that never waits costs no call.
    libfuse calls the function on another worker thread, or at once on the registering one
    when the interrupt came first, and possibly just after the request was answered: so it is
    one thunk for the mount's life, and its data a number naming the request, looked up here
    and ignored once the request is over. ``register`` is libfuse's function (tests give a
    stand-in).
    """

    def __init__(self, register: Callable[[int, Any, int], None] | None = None) -> None:
        self._register = register if register is not None else req_interrupt_func
        self._live: dict[int, _Request] = {}
        self._numbers = itertools.count(1)
        self.thunk = interrupt_func_t(_pinned(self._interrupted))

    def wrap(self, callback: Callable[..., None]) -> Callable[..., None]:
        """``callback(req, ...)`` under a cancellation of its own, fired by its interrupt."""
        live = self._live

        def call(req: int, *args: Any) -> None:
            request = _Request(self, req)
            try:
                with request:
                    callback(req, *args)
            finally:
                if request.number:
                    del live[request.number]

        return call

    def register(self, request: _Request) -> None:
        """Asks libfuse to call the interrupt function for ``request`` (its thread, once)."""
        request.number = number = next(self._numbers)
        self._live[number] = request
        self._register(request.req, self.thunk, number)

    def _interrupted(self, req: int, data: int | None) -> None:
        cancellation = self._live.get(data or 0)
        if cancellation is not None:
            try:
                cancellation.fire()
            except BaseException:  # nothing raises into libfuse
                logger.exception("interrupting a request failed")


class Callbacks:
    """The C-callable callbacks of one mount: each calls the file system and replies."""

    def __init__(self, fs: Operations, ops: Any, interrupts: Interrupts | None) -> None:
        self.fs = fs
        self.ops = ops
        self._buffers = _Buffers()
        self.interrupts = interrupts  # None: nothing waits, no request needs a cancellation
        self._keep: list[Any] = []  # the ctypes thunks must live as long as the FUSE session
        self.fuse_session: int = 0  # libfuse's struct fuse_session, once `serve` made it
        names = [name for name, kind in fuse_lowlevel_ops._fields_ if kind is not ctypes.c_void_p]
        for name in names:
            prototype = dict(fuse_lowlevel_ops._fields_)[name]
            method = getattr(self, "_" + name)
            if interrupts is not None and name not in _NOT_INTERRUPTIBLE:
                method = interrupts.wrap(method)
            thunk = prototype(_pinned(method))
            self._keep.append(thunk)
            setattr(ops, name, thunk)

    # Every callback: the file system's answer, or its errno; nothing escapes into libfuse.
    def _fail(self, req: int, name: str, err: BaseException) -> None:
        if isinstance(err, OSError) and isinstance(err.errno, int) and err.errno > 0:
            code = err.errno
        else:
            logger.error("%s failed on a bug; answering EIO", name, exc_info=err)
            code = errno.EIO
        reply_err(req, code)

    def _entry(self, entry: Entry) -> fuse_entry_param:
        param = fuse_entry_param()
        param.ino = entry.node
        _fill_stat(param.attr, entry.attr)
        param.attr_timeout = self.fs.attr_timeout
        param.entry_timeout = self.fs.entry_timeout
        return param

    def _reply_entry(self, req: int, entry: Entry) -> None:
        if reply_entry(req, ctypes.byref(self._entry(entry))) != 0:
            # The caller was interrupted: the kernel never took this reference.
            self.fs.forget(entry.node, 1)

    def _init(self, userdata: Any, conn: Any) -> None:
        try:
            self.fs.init(conn.contents, V3, self.fuse_session)
        except BaseException:
            logger.exception("init failed")

    def _destroy(self, userdata: Any) -> None:
        try:
            self.fs.destroy()
        except BaseException:
            logger.exception("destroy failed")

    def _lookup(self, req: int, parent: int, name: bytes) -> None:
        try:
            entry = self.fs.lookup(req, parent, name)
        except OSError as err:
            if err.errno == errno.ENOENT and self.fs.negative_timeout > 0:
                # A negative entry, cached by the kernel for negative_timeout.
                param = fuse_entry_param()
                param.entry_timeout = self.fs.negative_timeout
                reply_entry(req, ctypes.byref(param))
                return
            self._fail(req, "lookup", err)
            return
        except BaseException as err:
            self._fail(req, "lookup", err)
            return
        self._reply_entry(req, entry)

    def _forget(self, req: int, node: int, nlookup: int) -> None:
        try:
            self.fs.forget(node, nlookup)
        except BaseException:
            logger.exception("forget failed")
        reply_none(req)

    def _forget_multi(self, req: int, count: int, forgets: Any) -> None:
        try:
            for i in range(count):
                self.fs.forget(forgets[i].ino, forgets[i].nlookup)
        except BaseException:
            logger.exception("forget failed")
        reply_none(req)

    def _attr(self, req: int, st: os.stat_result) -> None:
        out = c_stat()
        _fill_stat(out, st)
        reply_attr(req, ctypes.byref(out), self.fs.attr_timeout)

    def _getattr(self, req: int, node: int, fi: Any) -> None:
        try:
            st = self.fs.getattr(req, node, fi.contents.fh if fi else None)
        except BaseException as err:
            self._fail(req, "getattr", err)
            return
        self._attr(req, st)

    def _setattr(self, req: int, node: int, attr: Any, to_set: int, fi: Any) -> None:
        try:
            a = attr.contents
            atime = mtime = None
            if to_set & SET_ATTR_ATIME_NOW:
                atime = NOW
            elif to_set & SET_ATTR_ATIME:
                atime = _time_ns(a.st_atimespec)
            if to_set & SET_ATTR_MTIME_NOW:
                mtime = NOW
            elif to_set & SET_ATTR_MTIME:
                mtime = _time_ns(a.st_mtimespec)
            change = SetAttr(
                mode=a.st_mode if to_set & SET_ATTR_MODE else None,
                uid=a.st_uid if to_set & SET_ATTR_UID else None,
                gid=a.st_gid if to_set & SET_ATTR_GID else None,
                size=a.st_size if to_set & SET_ATTR_SIZE else None,
                atime=atime,
                mtime=mtime,
            )
            st = self.fs.setattr(req, node, change, fi.contents.fh if fi else None)
        except BaseException as err:
            self._fail(req, "setattr", err)
            return
        self._attr(req, st)

    def _readlink(self, req: int, node: int) -> None:
        try:
            target = self.fs.readlink(req, node)
        except BaseException as err:
            self._fail(req, "readlink", err)
            return
        reply_readlink(req, target)

    def _made(self, req: int, name: str, make: Callable[[], Entry]) -> None:
        try:
            entry = make()
        except BaseException as err:
            self._fail(req, name, err)
            return
        self._reply_entry(req, entry)

    def _mknod(self, req: int, parent: int, name: bytes, mode: int, rdev: int) -> None:
        self._made(req, "mknod", lambda: self.fs.mknod(req, parent, name, mode, rdev))

    def _mkdir(self, req: int, parent: int, name: bytes, mode: int) -> None:
        self._made(req, "mkdir", lambda: self.fs.mkdir(req, parent, name, mode))

    def _symlink(self, req: int, target: bytes, parent: int, name: bytes) -> None:
        self._made(req, "symlink", lambda: self.fs.symlink(req, target, parent, name))

    def _link(self, req: int, node: int, new_parent: int, new_name: bytes) -> None:
        self._made(req, "link", lambda: self.fs.link(req, node, new_parent, new_name))

    def _done(self, req: int, name: str, call: Callable[[], object]) -> None:
        try:
            call()
        except BaseException as err:
            self._fail(req, name, err)
            return
        reply_err(req, 0)

    def _unlink(self, req: int, parent: int, name: bytes) -> None:
        self._done(req, "unlink", lambda: self.fs.unlink(req, parent, name))

    def _rmdir(self, req: int, parent: int, name: bytes) -> None:
        self._done(req, "rmdir", lambda: self.fs.rmdir(req, parent, name))

    def _rename(
        self, req: int, parent: int, name: bytes, new_parent: int, new_name: bytes, flags: int = 0
    ) -> None:
        self._done(
            req, "rename", lambda: self.fs.rename(req, parent, name, new_parent, new_name, flags)
        )

    @staticmethod
    def _set_open(fi: Any, opened: Opened) -> None:
        fi.fh = opened.fh
        if opened.direct_io:
            fi.direct_io = 1
        if opened.keep_cache:
            fi.keep_cache = 1
        if opened.noflush and V3:
            fi.noflush = 1

    def _open(self, req: int, node: int, fi: Any) -> None:
        try:
            opened = self.fs.open(req, node, fi.contents.flags)
        except BaseException as err:
            self._fail(req, "open", err)
            return
        self._set_open(fi.contents, opened)
        if reply_open(req, fi) != 0:  # the open was interrupted: nobody will release it
            self.fs.release(req, node, opened.fh)

    def _create(self, req: int, parent: int, name: bytes, mode: int, fi: Any) -> None:
        try:
            entry, opened = self.fs.create(req, parent, name, mode, fi.contents.flags)
        except BaseException as err:
            self._fail(req, "create", err)
            return
        self._set_open(fi.contents, opened)
        if reply_create(req, ctypes.byref(self._entry(entry)), fi) != 0:
            self.fs.release(req, entry.node, opened.fh)
            self.fs.forget(entry.node, 1)

    def _read(self, req: int, node: int, size: int, offset: int, fi: Any) -> None:
        buffer, view = self._buffers.get(size)
        try:
            done = self.fs.read(req, node, view, offset, fi.contents.fh)
        except BaseException as err:
            self._fail(req, "read", err)
            return
        reply_buf(req, buffer, done)

    def _write(self, req: int, node: int, buf: int, size: int, offset: int, fi: Any) -> None:
        try:
            info = fi.contents
            done = self.fs.write(req, node, _view(buf, size), offset, info.fh, bool(info.writepage))
        except BaseException as err:
            self._fail(req, "write", err)
            return
        reply_write(req, done)

    def _flush(self, req: int, node: int, fi: Any) -> None:
        self._done(req, "flush", lambda: self.fs.flush(req, node, fi.contents.fh))

    def _release(self, req: int, node: int, fi: Any) -> None:
        self._done(req, "release", lambda: self.fs.release(req, node, fi.contents.fh))

    def _fsync(self, req: int, node: int, datasync: int, fi: Any) -> None:
        self._done(req, "fsync", lambda: self.fs.fsync(req, node, bool(datasync), fi.contents.fh))

    def _opendir(self, req: int, node: int, fi: Any) -> None:
        try:
            opened = self.fs.opendir(req, node)
        except BaseException as err:
            self._fail(req, "opendir", err)
            return
        self._set_open(fi.contents, opened)
        if reply_open(req, fi) != 0:
            self.fs.releasedir(req, node, opened.fh)

    def _readdir(self, req: int, node: int, size: int, offset: int, fi: Any) -> None:
        try:
            address, length = self.fs.readdir(req, node, offset, fi.contents.fh).chunk(offset, size)
        except BaseException as err:
            self._fail(req, "readdir", err)
            return
        reply_buf(req, address, length)

    def _readdirplus(self, req: int, node: int, size: int, offset: int, fi: Any) -> None:
        # As readdir, each entry with its attributes: the kernel caches them as if it had
        # looked each name up (one reference each), so `ls -l` or `git status` after it
        # sends no LOOKUP. An entry that does not fit gives its reference back.
        assert add_direntry_plus is not None
        sent: list[int] = []
        try:
            listing = self.fs.readdir(req, node, offset, fi.contents.fh)
            entries = itertools.islice(listing.entries, offset, None)
            buffer, _ = self._buffers.get(size)
            address = ctypes.addressof(buffer)
            used = 0
            for entry in entries:
                param = fuse_entry_param()
                looked_up = 0
                if entry.name in (b".", b".."):
                    param.attr.st_ino = entry.ino
                    param.attr.st_mode = entry.mode
                else:
                    try:
                        found = self.fs.readdir_entry(node, entry.name)
                    except FileNotFoundError:
                        continue  # removed since the listing was taken
                    param = self._entry(found)
                    looked_up = found.node
                needed = add_direntry_plus(
                    req,
                    address + used,
                    size - used,
                    entry.name,
                    ctypes.byref(param),
                    entry.next_offset,
                )
                if needed > size - used:
                    if looked_up:
                        self.fs.forget(looked_up, 1)
                    break
                used += needed
                if looked_up:
                    sent.append(looked_up)
        except BaseException as err:
            for node in sent:
                self.fs.forget(node, 1)
            self._fail(req, "readdirplus", err)
            return
        if reply_buf(req, buffer, used) != 0:
            for node in sent:  # the kernel never took these references
                self.fs.forget(node, 1)

    def _releasedir(self, req: int, node: int, fi: Any) -> None:
        self._done(req, "releasedir", lambda: self.fs.releasedir(req, node, fi.contents.fh))

    def _fsyncdir(self, req: int, node: int, datasync: int, fi: Any) -> None:
        self._done(
            req, "fsyncdir", lambda: self.fs.fsyncdir(req, node, bool(datasync), fi.contents.fh)
        )

    def _statfs(self, req: int, node: int) -> None:
        try:
            st = self.fs.statfs(req, node)
            out = c_statvfs()
            for key in (
                "f_bsize",
                "f_frsize",
                "f_blocks",
                "f_bfree",
                "f_bavail",
                "f_files",
                "f_ffree",
                "f_favail",
                "f_flag",
                "f_namemax",
            ):
                setattr(out, key, getattr(st, key))
        except BaseException as err:
            self._fail(req, "statfs", err)
            return
        reply_statfs(req, ctypes.byref(out))

    def _setxattr(
        self, req: int, node: int, name: bytes, value: int, size: int, flags: int
    ) -> None:
        data = ctypes.string_at(value, size) if size else b""
        self._done(req, "setxattr", lambda: self.fs.setxattr(req, node, name, data, flags))

    def _sized(self, req: int, name: str, call: Callable[[], bytes], size: int) -> None:
        # size 0 asks how big the answer is; a smaller size than the answer is ERANGE.
        try:
            value = call()
        except BaseException as err:
            self._fail(req, name, err)
            return
        if size == 0:
            reply_xattr(req, len(value))
        elif len(value) > size:
            reply_err(req, errno.ERANGE)
        else:
            reply_buf(req, value, len(value))

    def _getxattr(self, req: int, node: int, name: bytes, size: int) -> None:
        self._sized(req, "getxattr", lambda: self.fs.getxattr(req, node, name), size)

    def _listxattr(self, req: int, node: int, size: int) -> None:
        self._sized(req, "listxattr", lambda: self.fs.listxattr(req, node), size)

    def _removexattr(self, req: int, node: int, name: bytes) -> None:
        self._done(req, "removexattr", lambda: self.fs.removexattr(req, node, name))

    def _access(self, req: int, node: int, mask: int) -> None:
        self._done(req, "access", lambda: self.fs.access(req, node, mask))

    def _fallocate(self, req: int, node: int, mode: int, offset: int, length: int, fi: Any) -> None:
        self._done(
            req,
            "fallocate",
            lambda: self.fs.fallocate(req, node, mode, offset, length, fi.contents.fh),
        )

    def _lseek(self, req: int, node: int, offset: int, whence: int, fi: Any) -> None:
        try:
            result = self.fs.lseek(req, node, offset, whence, fi.contents.fh)
        except BaseException as err:
            self._fail(req, "lseek", err)
            return
        assert reply_lseek is not None
        reply_lseek(req, result)
