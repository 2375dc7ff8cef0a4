"""The one import seam for the FUSE binding (mfusepy, ctypes over libfuse 2 or 3).

Everything else in `burstctl.fuse_shim` imports FUSE names from here, so the binding can be
swapped (e.g. for fusepy) in one place. Importing this module loads libfuse and raises
`OSError` when it is missing; callers import it lazily.
"""

from __future__ import annotations

import mfusepy

FUSE = mfusepy.FUSE
FuseOSError = mfusepy.FuseOSError
Operations = mfusepy.Operations
fuse_get_context = mfusepy.fuse_get_context

# (major, minor) of the libfuse that was loaded, e.g. (2, 9).
LIBFUSE_VERSION: tuple[int, int] = (mfusepy.fuse_version_major, mfusepy.fuse_version_minor)

__all__ = ["FUSE", "LIBFUSE_VERSION", "FuseOSError", "Operations", "fuse_get_context"]
