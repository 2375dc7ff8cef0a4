"""An HDF5 checkpoint (h5py), one file per rank, run under ``mpirun``; rank 0 prints one JSON line.

The checkpoint/restart pattern of a simulation that keeps its state in HDF5 without parallel
HDF5 (PyPI's h5py is serial and brings its own HDF5, whose default driver does ``pwrite`` and
``pread`` on the file): every rank writes its part of the state to ``ckpt.<rank>.h5`` (a
contiguous field, a chunked vector field, particle ids, a step attribute; ``--size`` bytes of
data in all per rank, from a generator seeded by the rank), the ranks meet at a barrier, and
each restarts from its neighbour's file (rank r reads rank r+1's, so no rank reads what it
has just written) and checks every dataset against what that rank wrote.

The JSON: the ranks, per phase the data bytes and seconds (the slowest rank's, barrier to
barrier), ``file_bytes`` (the files' sizes: data and HDF5's own metadata), and ``checksum``:
SHA-256 over the SHA-256 of every dataset as read back (files in name order, datasets by
name). The files themselves carry no times (h5py does not record them by default), so two runs
write the same bytes.

    mpirun -np 4 python bench/workloads/h5_checkpoint.py DIR [--size 2MiB] [--seed 33]

Exits 1 (every rank) when a dataset read back differs from what was written.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

import h5py
import numpy as np
from ior_like import timed_phase
from mpi4py import MPI

from burstctl.common.units import parse_size


def arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--size", type=parse_size, default=2 << 20)
    parser.add_argument("--seed", type=int, default=33)
    return parser.parse_args(argv)


def state(seed: int, rank: int, nbytes: int) -> dict[str, np.ndarray]:
    """A rank's state: half its bytes a float64 field, a quarter a float32 (n, 3) vector field,
    a quarter int64 particle ids."""
    rng = np.random.default_rng([seed, rank])
    n = nbytes // 16
    return {
        "fields/temperature": rng.standard_normal(n),
        "fields/velocity": rng.standard_normal((nbytes // 4 // 12, 3), dtype=np.float32),
        "particles/ids": rng.integers(0, 1 << 62, nbytes // 4 // 8, dtype=np.int64),
    }


def path_of(directory: Path, rank: int) -> Path:
    return directory / f"ckpt.{rank:05d}.h5"


def write(args: argparse.Namespace, rank: int) -> int:
    data = state(args.seed, rank, args.size)
    with h5py.File(path_of(args.directory, rank), "w") as f:
        f.attrs["step"] = 1000 + rank
        for name, array in data.items():
            # the vector field in chunks of 4096 rows, as a solver writes it by blocks
            chunks = (4096, 3) if array.ndim == 2 else None
            f.create_dataset(name, data=array, chunks=chunks)
        f.flush()
    return sum(a.nbytes for a in data.values())


def read(args: argparse.Namespace, rank: int, ranks: int) -> tuple[bool, int, list]:  # type: ignore[type-arg]
    """Restarts from the neighbour's file: (all as written, data bytes, [(file, name, digest)])."""
    source = (rank + 1) % ranks
    expected = state(args.seed, source, args.size)
    good, nbytes, digests = True, 0, []
    path = path_of(args.directory, source)
    with h5py.File(path, "r") as f:
        good &= int(f.attrs["step"]) == 1000 + source
        for name in sorted(expected):
            array = f[name][()]
            good &= array.dtype == expected[name].dtype and np.array_equal(array, expected[name])
            nbytes += array.nbytes
            digests.append((path.name, name, hashlib.sha256(array.tobytes()).digest()))
    return good, nbytes, digests


def main(argv: list[str]) -> int:
    args = arguments(argv)
    comm = MPI.COMM_WORLD
    rank, ranks = comm.Get_rank(), comm.Get_size()
    write_s, written = timed_phase(comm, lambda: write(args, rank))
    read_s, (good, nbytes, digests) = timed_phase(comm, lambda: read(args, rank, ranks))  # type: ignore[misc]
    ok = comm.allreduce(good, op=MPI.LAND)
    written = comm.allreduce(written)
    nbytes = comm.allreduce(nbytes)
    gathered = comm.gather(digests)
    if gathered is not None:
        checksum = hashlib.sha256()
        for _, _, digest in sorted(d for part in gathered for d in part):
            checksum.update(digest)
        report = {
            "ranks": ranks,
            "write": {"bytes": written, "seconds": round(write_s, 4)},
            "read": {"bytes": nbytes, "seconds": round(read_s, 4)},
            "file_bytes": sum(os.path.getsize(path_of(args.directory, r)) for r in range(ranks)),
            "files": [path_of(args.directory, r).name for r in range(ranks)],
            "checksum": checksum.hexdigest(),
            "verified": bool(ok),
        }
        print(json.dumps(report), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
