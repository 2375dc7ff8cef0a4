"""What the mount knows about ``security.capability``: which inodes have none, for a while.

With the kernel page cache on, the kernel asks for ``security.capability`` before every
``write(2)`` (to strip it) and almost always hears ENODATA: one GETXATTR request per write.
`AbsentCapabilities` remembers that answer per inode for `CAPABILITY_ABSENT_TTL` seconds, so
`fs.PassthroughFS.getxattr` answers those lookups without touching the backing directory. Its
docstring says why that is safe; the file system forgets everything on each call that could
give a node a capability.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Hashable

CAPABILITY = "security.capability"
# How long "this node has no security.capability" is believed: the bound on how late a
# capability set on BACKING behind the mount's back is seen through it.
CAPABILITY_ABSENT_TTL = 1.0
_ABSENT_MAX = 4096  # entries; past it, expired ones are swept, then all if still full


class AbsentCapabilities:
    """Nodes known to have no ``security.capability`` (ENODATA), for at most ``ttl`` seconds.

    Why answering from it is safe:

    - Only absence is remembered, never a value: the cache can hide a capability set behind
      the mount's back for up to ``ttl`` (an exec then gets fewer privileges, never more), it
      can never invent one.
    - Through the mount, a node can only come to carry a capability by ``setxattr`` or by
      a change of names (``rename``, ``link``, ``unlink``, ``rmdir``): each of them (and
      ``removexattr``) forgets everything *after* changing BACKING, and bumps a generation,
      so a lookup that raced with it and read the old state is not remembered.
    - The kernel asks before a write or truncate in order to strip the capability; a stale
      "absent" skips that REMOVEXATTR, but the daemon's own ``pwrite``/``ftruncate`` on
      BACKING makes the backing file system strip it anyway.
    """

    def __init__(self, ttl: float = CAPABILITY_ABSENT_TTL) -> None:
        self._ttl = ttl
        self._lock = threading.Lock()
        self._absent: dict[Hashable, float] = {}
        self.generation = 0
        self.hits = 0  # for tests and benchmarks

    def known_absent(self, key: Hashable) -> bool:
        expiry = self._absent.get(key)
        if expiry is not None and expiry > time.monotonic():
            self.hits += 1
            return True
        return False

    def remember(self, key: Hashable, generation: int) -> None:
        """Records ENODATA for ``key``, unless something was forgotten since ``generation``."""
        now = time.monotonic()
        with self._lock:
            if generation != self.generation:
                return
            if len(self._absent) >= _ABSENT_MAX:
                self._absent = {k: v for k, v in self._absent.items() if v > now}
                if len(self._absent) >= _ABSENT_MAX:
                    self._absent.clear()
            self._absent[key] = now + self._ttl

    def forget_all(self) -> None:
        with self._lock:
            self.generation += 1
            self._absent.clear()
