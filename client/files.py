"""`throttled_open`: a file object whose reads and writes are paced by a `Session`.

For applications that can be changed a little; unmodified ones go through the FUSE shim.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import IO, Any

from burstctl.client.session import Session


class ThrottledFile:
    """Wraps an open file; ``read``/``readinto``/``write`` acquire from the session first.

    Reads of unknown size (``read()``, ``readline()``) are charged after the fact, with what
    they returned. Every other attribute is the wrapped file's.
    """

    def __init__(self, file: IO[Any], session: Session) -> None:
        self._file = file
        self._session = session

    @property
    def raw_file(self) -> IO[Any]:
        return self._file

    def read(self, size: int | None = -1) -> Any:
        if size is None or size < 0:
            data = self._file.read()
            self._session.acquire(self._nbytes(data), "read")
            return data
        self._session.acquire(size, "read")
        return self._file.read(size)

    def readinto(self, buffer: Any) -> int | None:
        self._session.acquire(memoryview(buffer).nbytes, "read")
        return self._file.readinto(buffer)  # type: ignore[attr-defined]

    def readline(self, size: int | None = -1) -> Any:
        line = self._file.readline(-1 if size is None else size)
        self._session.acquire(self._nbytes(line), "read")
        return line

    def readlines(self, hint: int = -1) -> list[Any]:
        lines = self._file.readlines(hint)
        self._session.acquire(sum(self._nbytes(line) for line in lines), "read")
        return lines

    def write(self, data: Any) -> int:
        self._session.acquire(self._nbytes(data), "write")
        return self._file.write(data)

    def writelines(self, lines: Iterable[Any]) -> None:
        for line in lines:
            self.write(line)

    def __iter__(self) -> Iterator[Any]:
        while line := self.readline():
            yield line

    def __enter__(self) -> ThrottledFile:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._file.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._file, name)

    def _nbytes(self, data: Any) -> int:
        if isinstance(data, str):
            encoding = getattr(self._file, "encoding", None) or "utf-8"
            return len(data.encode(encoding, errors="replace"))
        return memoryview(data).nbytes


def throttled_open(
    path: str | os.PathLike[str],
    mode: str = "rb",
    *,
    session: Session,
    **open_kwargs: Any,
) -> ThrottledFile:
    """Opens ``path`` like `open` and paces its reads and writes through ``session``.

    Opening counts as one metadata operation of 0 bytes.
    """
    session.acquire(0, "metadata")
    return ThrottledFile(open(path, mode, **open_kwargs), session)
