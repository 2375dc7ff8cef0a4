"""Darshan logs read with PyDarshan: the one module that imports ``darshan`` ([DARSHAN]).

Owns what the replay takes from a log (docs/simulator.md, "Darshan replay"): the job's
ranks and run time, and its transfers, each a number of bytes moved over an interval of
time since the job's start:

- POSIX, MPI-IO and STDIO counter records: one transfer per record and direction, the
  ``*_BYTES_READ`` / ``*_BYTES_WRITTEN`` over ``*_F_READ_*`` / ``*_F_WRITE_*`` start to end.
  A shared-file record (rank −1) is one transfer for all its ranks.
- DXT segments, where the log has them: one transfer per segment (its length over its
  start to end), in place of the counters of the same file and rank (of the same file,
  every rank's, for a shared-file record).
- One layer per file: POSIX where the file has POSIX records (MPI-IO lands there through
  ROMIO's POSIX calls, so counting both would count its bytes twice), else MPI-IO. STDIO is
  kept beside them: its buffered writes reach the kernel below Darshan's POSIX wrappers.
  Standard streams (``<STDOUT>``, ``<STDERR>``, ``<STDIN>``, by name or by record id) are
  left out: terminal output spread over the whole run, not storage I/O.

A file that is not a readable Darshan log raises ``LogError`` naming it: libdarshan-util
reports a damaged log on the process's stderr and PyDarshan then returns fewer records or
none, so its C-level messages are captured while the log is read and any ``Error:`` among
them fails the read; and since it can also crash on a truncated log, each log is read in a
child process whose death is that log's error.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

# The counter modules, their counters' prefix, and the DXT module with their segments.
_COUNTERS = (
    ("POSIX", "POSIX", "DXT_POSIX"),
    ("MPI-IO", "MPIIO", "DXT_MPIIO"),
    ("STDIO", "STDIO", ""),
)
_STREAMS = frozenset({"<STDOUT>", "<STDERR>", "<STDIN>"})
# Their record ids (Darshan's hash of the name), which logs with obfuscated names keep.
_STREAM_IDS = frozenset({14734109647742566553, 15920181672442173319, 7238257241479193519})


class LogError(ValueError):
    """A file that is not a readable Darshan log; the message names it."""

    def __init__(self, path: str | Path, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = str(path)


@dataclass(frozen=True, slots=True)
class Transfer:
    """Bytes one record (or one DXT segment) moved over [start, end], seconds since the
    job's start."""

    start: float
    end: float
    nbytes: int
    kind: str  # "read" or "write"
    module: str  # POSIX, MPI-IO, STDIO, DXT_POSIX, DXT_MPIIO
    rank: int  # −1: a shared-file record
    file: int  # Darshan's record id of the file


@dataclass(frozen=True, slots=True)
class DarshanLog:
    """What the replay takes from one log."""

    path: str
    job_id: int
    nprocs: int
    run_time: float  # seconds; at least the end of its last transfer
    transfers: tuple[Transfer, ...]
    dxt: bool  # some transfers are DXT segments

    @property
    def name(self) -> str:
        return Path(self.path).name.removesuffix(".darshan")

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.transfers)


def read_log(path: str | Path) -> DarshanLog:
    """Reads ``path``; ``LogError`` if it is not a readable Darshan log (or PyDarshan is
    not installed).

    The log is read in a child process: libdarshan-util trusts a log's own offsets and
    lengths, and on a truncated log it can crash the process (SIGSEGV) instead of
    reporting an error. A crash of the child is that log's ``LogError``.
    """
    if not Path(path).exists():
        raise LogError(path, "no such file")
    if not Path(path).is_file():
        raise LogError(path, "not a file")
    reader, writer = multiprocessing.Pipe(duplex=False)
    child = multiprocessing.get_context("fork").Process(
        target=_read_in_child, args=(str(path), writer), daemon=True
    )
    child.start()
    writer.close()
    try:
        ok, value = reader.recv()
    except EOFError:  # the child died before it could answer
        child.join()
        code = child.exitcode
        how = f"signal {signal.Signals(-code).name}" if code is not None and code < 0 else code
        raise LogError(path, f"libdarshan-util died reading it ({how}): a damaged log") from None
    finally:
        reader.close()
    child.join()
    if not ok:
        raise LogError(path, value)
    assert isinstance(value, DarshanLog)
    return value


def _read_in_child(path: str, writer: Connection) -> None:
    """The child of ``read_log``: sends (True, the log) or (False, why not), then exits
    at once (closing a damaged log's handle can abort, and there is nothing to clean)."""
    try:
        try:
            answer: tuple[bool, object] = (True, _read_here(path))
        except LogError as exc:
            answer = (False, str(exc).removeprefix(f"{path}: "))
        writer.send(answer)
        writer.close()
    finally:
        os._exit(0)


def _read_here(path: str) -> DarshanLog:
    """Reads ``path`` in this process (``read_log``'s child)."""
    try:
        import darshan
    except ImportError:
        raise LogError(
            path, "reading Darshan logs needs PyDarshan: pip install 'burstctl[sim]'"
        ) from None
    failure: Exception | None = None
    with _c_errors() as errors:
        report = darshan.DarshanReport()
        try:
            report.open(path, read_all=False)
            log = _read(report, path)
        except Exception as exc:  # PyDarshan's own: RuntimeError, KeyError, ValueError
            failure = exc
        problems = errors()
    if isinstance(failure, LogError):
        raise failure
    if failure is not None or problems:
        raise LogError(path, problems[0] if problems else f"not a Darshan log ({failure})")
    return log


def _read(report: Any, path: str) -> DarshanLog:
    job = report.metadata["job"]
    nprocs = int(job["nprocs"])
    if nprocs < 1:
        raise LogError(path, f"the job has {nprocs} processes")
    report.read_name_records()
    names = report.name_records
    transfers: list[Transfer] = []
    posix_files: set[int] = set()
    for module, prefix, dxt_module in _COUNTERS:
        if module not in report.modules:
            continue
        segments = _dxt(report, dxt_module) if dxt_module in report.modules else {}
        report.mod_read_all_records(module, dtype="numpy", warnings=False)
        for rec in report.records[module]:
            file_id, rank = int(rec["id"]), int(rec["rank"])
            if module == "POSIX":
                posix_files.add(file_id)
            elif module == "MPI-IO" and file_id in posix_files:
                continue
            if file_id in _STREAM_IDS or names.get(file_id) in _STREAMS:
                continue
            if (file_id, rank) in segments:
                transfers.extend(segments[file_id, rank])
                continue
            if rank == -1 and any(f == file_id for f, _ in segments):
                # a shared record stands for all ranks: every rank's segments of the file
                for (f, _), each in segments.items():
                    if f == file_id:
                        transfers.extend(each)
                continue
            counters = dict(zip(report.counters[module]["counters"], rec["counters"], strict=True))
            times = dict(zip(report.counters[module]["fcounters"], rec["fcounters"], strict=True))
            for kind, moved, began, ended in (
                ("read", "BYTES_READ", "F_READ_START_TIMESTAMP", "F_READ_END_TIMESTAMP"),
                ("write", "BYTES_WRITTEN", "F_WRITE_START_TIMESTAMP", "F_WRITE_END_TIMESTAMP"),
            ):
                nbytes = int(counters[f"{prefix}_{moved}"])
                if nbytes > 0:
                    start = max(0.0, float(times[f"{prefix}_{began}"]))
                    end = max(start, float(times[f"{prefix}_{ended}"]))
                    transfers.append(Transfer(start, end, nbytes, kind, module, rank, file_id))
    transfers.sort(key=lambda t: (t.start, t.end, t.file, t.rank))
    last = max((t.end for t in transfers), default=0.0)
    return DarshanLog(
        path=path,
        job_id=int(job.get("jobid", 0)),
        nprocs=nprocs,
        run_time=max(float(job.get("run_time", 0.0)), last),
        transfers=tuple(transfers),
        dxt=any(t.module.startswith("DXT") for t in transfers),
    )


def _dxt(report: Any, module: str) -> dict[tuple[int, int], list[Transfer]]:
    """The DXT segments of ``module``, by (file, rank)."""
    report.mod_read_all_dxt_records(module, dtype="dict", warnings=False)
    found: dict[tuple[int, int], list[Transfer]] = {}
    for rec in report.records[module]:
        file_id, rank = int(rec["id"]), int(rec["rank"])
        moved = found.setdefault((file_id, rank), [])
        for kind in ("read", "write"):
            for seg in rec[f"{kind}_segments"]:
                if int(seg["length"]) > 0:
                    start = max(0.0, float(seg["start_time"]))
                    end = max(start, float(seg["end_time"]))
                    length = int(seg["length"])
                    moved.append(Transfer(start, end, length, kind, module, rank, file_id))
    return found


@contextlib.contextmanager
def _c_errors() -> Iterator[Callable[[], list[str]]]:
    """Sends what is written to file descriptor 2 meanwhile (libdarshan-util's messages)
    to a file instead of the terminal; yields a function that returns its ``Error:`` lines
    so far."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as sink:

        def errors() -> list[str]:
            sink.seek(0)
            lines = sink.read().decode(errors="replace").splitlines()
            return [
                line.removeprefix("Error:").strip().rstrip(".")
                for line in lines
                if line.startswith("Error:")
            ]

        os.dup2(sink.fileno(), 2)
        try:
            yield errors
        finally:
            os.dup2(saved, 2)
            os.close(saved)
