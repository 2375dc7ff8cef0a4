"""The one import seam for the FUSE binding: libfuse's low-level API, over ctypes.

Everything else in `burstctl.fuse_shim` imports FUSE names from here, never from the modules
below. Importing this package loads libfuse (2 or 3, through mfusepy's loader, which honours
``FUSE_LIBRARY_PATH``) and raises `OSError` when it is missing; callers import it lazily.

Why the low-level API (``fuse_lowlevel.h``) rather than libfuse's path-based one: requests
name an inode, not a path. The file system keeps a handle per inode (`fs.PassthroughFS`), so

- depth is not limited by PATH_MAX, and a file unlinked or replaced while open keeps working
  through its handle (``fstat``, ``fchmod``, ``futimens`` included);
- hard links are one kernel inode, so the kernel may cache attributes and names
  (``attr_timeout`` / ``entry_timeout``): a ``stat`` of a cached name never reaches Python;
- one request is one Python call (the path API adds a GETATTR after every create, mknod,
  mkdir, symlink and link, and builds a path for each request under a global lock);
- ``rename`` gets its flags (RENAME_EXCHANGE, RENAME_NOREPLACE) and libfuse 3 ``lseek``
  (SEEK_DATA / SEEK_HOLE).

The binding's parts:

- `lowlevel`: the ctypes declarations (structures, the table of operations, the bound
  functions, the capability and setattr bits) for the libfuse loaded;
- `operations`: what a file system implements (`Operations`) and the values it takes and
  returns (`Context`, `Entry`, `Opened`, `SetAttr`, `DirEntry`, `Listing`);
- `callbacks`: one C-callable wrapper per operation, each behind the errno barrier: it calls
  the file system's method, sends the reply, and turns an `OSError` into its errno (anything
  else is logged and answered EIO), so nothing ever raises into libfuse;
- `loop`: `serve` mounts, runs libfuse's multithreaded loop until the mount is gone, and
  unmounts; `KernelNotifier` asks the kernel to drop cached names, and an inode's cached
  attributes or pages, while the session is up;
- `direct_io_mmap`: `DirectIoMmap` patches libfuse 3.14's INIT reply to allow shared ``mmap``
  of ``direct_io`` files.
"""

from __future__ import annotations

from burstctl.fuse_shim._fuse.direct_io_mmap import (
    DirectIoMmap,
    grant_direct_io_mmap,
    kernel_release,
)
from burstctl.fuse_shim._fuse.loop import (
    ConnectionAborted,
    KernelNotifier,
    MountFailed,
    option_args,
    serve,
)
from burstctl.fuse_shim._fuse.lowlevel import (
    CAP_ASYNC_READ,
    CAP_ATOMIC_O_TRUNC,
    CAP_AUTO_INVAL_DATA,
    CAP_BIG_WRITES,
    CAP_CACHE_SYMLINKS,
    CAP_HANDLE_KILLPRIV,
    LIBFUSE_VERSION,
    ROOT_ID,
)
from burstctl.fuse_shim._fuse.operations import (
    NOW,
    Context,
    DirEntry,
    Entry,
    Listing,
    Opened,
    Operations,
    SetAttr,
    request_context,
)

__all__ = [
    "CAP_ASYNC_READ",
    "CAP_ATOMIC_O_TRUNC",
    "CAP_AUTO_INVAL_DATA",
    "CAP_BIG_WRITES",
    "CAP_CACHE_SYMLINKS",
    "CAP_HANDLE_KILLPRIV",
    "LIBFUSE_VERSION",
    "NOW",
    "ROOT_ID",
    "ConnectionAborted",
    "Context",
    "DirEntry",
    "DirectIoMmap",
    "Entry",
    "KernelNotifier",
    "Listing",
    "MountFailed",
    "Opened",
    "Operations",
    "SetAttr",
    "grant_direct_io_mmap",
    "kernel_release",
    "option_args",
    "request_context",
    "serve",
]
