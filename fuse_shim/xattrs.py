"""The extended attributes the mount shows of a backing node.

The stage-out's own marks (``user.burstctl.*``, `stageout_marks`) are hidden: not read, not
listed, and neither set nor removed through the mount (EPERM). ``security.capability``, which
the kernel asks for before every write through its page cache, is answered from what is known
absent (`capabilities.AbsentCapabilities`); every call that could give a node a capability
forgets all of that (`ExtendedAttributes.forget_capabilities`).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable

from burstctl.common.syscalls import proc_path
from burstctl.fuse_shim.capabilities import CAPABILITY, AbsentCapabilities
from burstctl.node.stageout_marks import MARK_PREFIX

_CAPABILITY = CAPABILITY.encode()
# The stage-out's marks on backing files: hidden from applications.
_OWN_XATTRS_TEXT = MARK_PREFIX
_OWN_XATTRS = _OWN_XATTRS_TEXT.encode()


class ExtendedAttributes:
    """getxattr, listxattr, setxattr and removexattr of a node by its ``O_PATH`` handle;
    ``changed(path_fd)`` is told of each attribute set or removed (the stage-out's copy)."""

    def __init__(self, changed: Callable[[int], object] | None = None) -> None:
        self.no_capability = AbsentCapabilities()
        self._changed = changed

    def get(self, node: int, path_fd: int, name: bytes) -> bytes:
        if name.startswith(_OWN_XATTRS):
            raise OSError(errno.ENODATA, "no such attribute")
        path = proc_path(path_fd)
        if name != _CAPABILITY:
            return os.getxattr(path, name)
        if self.no_capability.known_absent(node):
            raise OSError(errno.ENODATA, "no such attribute")
        generation = self.no_capability.generation
        try:
            return os.getxattr(path, name)
        except OSError as err:
            if err.errno == errno.ENODATA:
                self.no_capability.remember(node, generation)
            raise

    def list(self, path_fd: int) -> bytes:
        names = os.listxattr(proc_path(path_fd))
        return b"".join(os.fsencode(n) + b"\0" for n in names if not n.startswith(_OWN_XATTRS_TEXT))

    def set(self, path_fd: int, name: bytes, value: bytes, flags: int) -> None:
        _refuse_own(name)
        try:
            os.setxattr(proc_path(path_fd), name, value, flags)
        finally:
            self.forget_capabilities()
        if self._changed is not None:
            self._changed(path_fd)

    def remove(self, path_fd: int, name: bytes) -> None:
        _refuse_own(name)
        try:
            os.removexattr(proc_path(path_fd), name)
        finally:
            self.forget_capabilities()
        if self._changed is not None:
            self._changed(path_fd)

    def forget_capabilities(self) -> None:
        """Something may have given a node a capability (a change of names, an xattr)."""
        self.no_capability.forget_all()


def _refuse_own(name: bytes) -> None:
    if name.startswith(_OWN_XATTRS):
        raise OSError(errno.EPERM, "the mount's own attribute")
