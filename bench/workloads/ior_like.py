"""An IOR-like MPI-IO workload (mpi4py), run under ``mpirun``; rank 0 prints one JSON line.

IOR's access pattern and vocabulary: each rank writes ``--segments`` segments of one block
(``--block`` bytes) in transfers of ``--transfer`` bytes, then every rank reads back and checks
the blocks its neighbour wrote (IOR's ``-C``: rank r reads rank r+1's, so no rank reads what
it has just written itself). Per run, one layout and one API:

- layout ``n1``: all ranks share one file, blocks rank-strided (IOR's segmented layout: segment
  s of rank r at ``(s * N + r) * block``); ``nn``: one file per rank (IOR's ``-F``), segment s
  at ``s * block``;
- API ``collective``: ``File.Write_at_all`` / ``File.Read_at_all`` (IOR's ``-c``);
  ``independent``: ``File.Write_at`` / ``File.Read_at``; ``nonblocking`` (not in the default
  list): ``File.Iwrite_at`` / ``File.Iread_at``, a block's transfers started together and
  waited for with ``Waitall``. Every call names its offset: no file pointer, shared or
  individual, is used.

A file is opened write-only for the write phase (and synced before it is closed) and read-only
for the read phase. The data of (rank, segment) are the same whatever the layout and API, from
a seeded generator (``--seed``), so two runs of the same options write the same bytes.

The JSON: the ranks, the options, and per run its files, the bytes and seconds of each phase
(seconds from a barrier before the first call to a barrier after the close, the slowest rank's)
and ``checksum``: SHA-256 over the SHA-256 of every block as read back, in file order (files
in name order, blocks by offset): what the files hold, computed without gathering their bytes.
With ``--timeline`` also ``timeline``: every blocking call of every rank as ``[start, end,
bytes, "write"|"read"]``, times in seconds since the epoch (one clock for all the ranks of a node).

    mpirun -np 4 python bench/workloads/ior_like.py DIR [--block 1MiB] [--transfer 256KiB]
        [--segments 4] [--layouts n1,nn] [--apis collective,independent] [--seed 33]
        [--no-read] [--timeline]

Exits 1 (every rank) when a block read back differs from what was written.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

import numpy as np
from mpi4py import MPI

from burstctl.common.units import parse_size


def arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--block", type=parse_size, default=1 << 20)
    parser.add_argument("--transfer", type=parse_size, default=256 << 10)
    parser.add_argument("--segments", type=int, default=4)
    parser.add_argument("--layouts", default="n1,nn")
    parser.add_argument("--apis", default="collective,independent")
    parser.add_argument("--prefix", default="ior")
    parser.add_argument("--seed", type=int, default=33)
    parser.add_argument("--no-read", dest="read", action="store_false")
    parser.add_argument("--timeline", action="store_true")
    args = parser.parse_args(argv)
    if args.transfer <= 0 or args.block % args.transfer:
        parser.error("--block must be a multiple of --transfer")
    return args


def block_data(seed: int, rank: int, segment: int, nbytes: int) -> bytes:
    return np.random.default_rng([seed, rank, segment]).bytes(nbytes)


class Run:
    """One layout and API on one communicator: where each block goes, and the calls."""

    def __init__(self, comm: MPI.Intracomm, args: argparse.Namespace, layout: str, api: str):
        self.comm, self.args, self.layout, self.api = comm, args, layout, api
        self.rank, self.ranks = comm.Get_rank(), comm.Get_size()
        self.calls: list[list[float | int | str]] = []
        name = f"{args.prefix}-{layout}-{api}"
        self.files = (
            [f"{name}.dat"] if layout == "n1" else [f"{name}.{r:05d}" for r in range(self.ranks)]
        )

    def path_and_offset(self, rank: int, segment: int) -> tuple[str, int]:
        block = self.args.block
        if self.layout == "n1":
            return self.files[0], (segment * self.ranks + rank) * block
        return self.files[rank], segment * block

    def open(self, name: str, amode: int) -> MPI.File:
        # N-N: each rank's file is its own (COMM_SELF), as IOR's -F opens it
        comm = self.comm if self.layout == "n1" else MPI.COMM_SELF
        return MPI.File.Open(comm, str(self.args.directory / name), amode)

    def block(self, fh: MPI.File, ddir: str, offset: int, view: memoryview) -> None:
        """One block in transfers: blocking calls one after the other (each timed for the
        timeline), or nonblocking ones all started, then waited for together."""
        step = self.args.transfer
        pieces = [(offset + t, view[t : t + step]) for t in range(0, len(view), step)]
        if self.api == "nonblocking":
            begin = fh.Iwrite_at if ddir == "write" else fh.Iread_at
            MPI.Request.Waitall([begin(at, piece) for at, piece in pieces])
            return
        if self.api == "collective":
            call = fh.Write_at_all if ddir == "write" else fh.Read_at_all
        else:
            call = fh.Write_at if ddir == "write" else fh.Read_at
        for at, piece in pieces:
            start = time.time()
            call(at, piece)
            if self.args.timeline:
                self.calls.append([start, time.time(), len(piece), ddir])

    def write(self) -> None:
        args = self.args
        name, _ = self.path_and_offset(self.rank, 0)
        fh = self.open(name, MPI.MODE_WRONLY | MPI.MODE_CREATE)
        for segment in range(args.segments):
            _, offset = self.path_and_offset(self.rank, segment)
            data = block_data(args.seed, self.rank, segment, args.block)
            self.block(fh, "write", offset, memoryview(data))
        fh.Sync()
        fh.Close()

    def read(self) -> tuple[bool, list[tuple[str, int, bytes]]]:
        """Reads the neighbour's blocks back: (all as written, [(file, offset, digest)])."""
        args = self.args
        source = (self.rank + 1) % self.ranks
        name, _ = self.path_and_offset(source, 0)
        fh = self.open(name, MPI.MODE_RDONLY)
        good, digests = True, []
        buf = bytearray(args.block)
        for segment in range(args.segments):
            path, offset = self.path_and_offset(source, segment)
            self.block(fh, "read", offset, memoryview(buf))
            good &= buf == block_data(args.seed, source, segment, args.block)
            digests.append((path, offset, hashlib.sha256(buf).digest()))
        fh.Close()
        return good, digests


def timed_phase(comm: MPI.Intracomm, phase) -> tuple[float, object]:  # type: ignore[no-untyped-def]
    comm.Barrier()
    start = MPI.Wtime()
    result = phase()
    comm.Barrier()
    return comm.allreduce(MPI.Wtime() - start, op=MPI.MAX), result


def main(argv: list[str]) -> int:
    args = arguments(argv)
    comm = MPI.COMM_WORLD
    ranks = comm.Get_size()
    moved = ranks * args.segments * args.block
    report: dict[str, object] = {
        "ranks": ranks,
        "block": args.block,
        "transfer": args.transfer,
        "segments": args.segments,
        "runs": [],
    }
    timeline: list[list[float | int | str]] = []
    ok = True
    for layout in args.layouts.split(","):
        for api in args.apis.split(","):
            run = Run(comm, args, layout, api)
            seconds, _ = timed_phase(comm, run.write)
            entry: dict[str, object] = {
                "layout": layout,
                "api": api,
                "files": run.files,
                "write": {"bytes": moved, "seconds": round(seconds, 4)},
            }
            if args.read:
                seconds, (good, digests) = timed_phase(comm, run.read)  # type: ignore[misc]
                ok &= comm.allreduce(good, op=MPI.LAND)
                gathered = comm.gather(digests)
                if gathered is not None:
                    checksum = hashlib.sha256()
                    for _, _, digest in sorted(d for part in gathered for d in part):
                        checksum.update(digest)
                    entry["read"] = {"bytes": moved, "seconds": round(seconds, 4)}
                    entry["checksum"] = checksum.hexdigest()
            report["runs"].append(entry)  # type: ignore[attr-defined]
            timeline.extend(run.calls)
    if args.timeline:
        gathered_calls = comm.gather(timeline)
        if gathered_calls is not None:
            report["timeline"] = [call for part in gathered_calls for call in part]
    if comm.Get_rank() == 0:
        report["verified"] = bool(ok) and args.read
        print(json.dumps(report), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
