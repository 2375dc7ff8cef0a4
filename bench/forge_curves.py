"""Regenerates ``simulator/placement/data/forge_mn4.json``, the measured bandwidth curves of
[FORGE] (docs/references.md), from a checkout of the public repository
``jeanbez/forge-evaluation``.

The measurements: FORGE, an I/O forwarding emulator, ran 189 write access patterns
(processes, client nodes, file layout, spatiality, request size) on MareNostrum 4 with 1, 2,
4 and 8 I/O forwarding nodes, about five repetitions each; the authors' parsed results are
``run/output/marenostrum-4/results/results.csv`` (one row per run, ``;``-separated,
bandwidth in MB/s). This script reads that file at a commit (``git show``, so a bare clone
does), groups the rows by pattern and count, and writes per pattern and count the mean,
standard deviation, number of repetitions, minimum and maximum of the bandwidth. The runs
without forwarding (the direct GPFS access of ``results/`` under ``marenostrum-4-gpfs``,
0 forwarders) are not read: 0 is not a count of I/O resources in the model.

    python bench/forge_curves.py REPO [--commit HEAD] [--out FILE]

``--out`` defaults to the data file above.

Prints JSON: the commit, the numbers of rows, patterns and counts, the file written.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import statistics
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

REPOSITORY = "https://github.com/jeanbez/forge-evaluation"
RESULTS = "run/output/marenostrum-4/results/results.csv"
OUT = Path(__file__).resolve().parents[1] / "simulator" / "placement" / "data" / "forge_mn4.json"
LAYOUT = {"0": "file-per-process", "1": "shared-file"}
SPATIALITY = {"0": "contiguous", "1": "strided"}


def pattern_key(row: Mapping[str, str]) -> tuple[int, int, str, str, int]:
    """(processes, client nodes, layout, spatiality, request KiB): one access pattern."""
    return (
        int(row["processes"]),
        int(row["clients"]),
        LAYOUT[row["layout"]],
        SPATIALITY[row["spatiality"]],
        int(row["request"]),
    )


def curves(rows: Iterable[Mapping[str, str]]) -> list[dict[str, Any]]:
    """One entry per pattern, sorted by its key: per measured count n ≥ 1 of forwarding
    nodes the bandwidth's mean, sample standard deviation (0 with one run), repetitions,
    minimum and maximum, rounded to 0.001 MB/s."""
    runs: dict[tuple[int, int, str, str, int], dict[int, list[float]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for row in rows:
        if row["operation"] != "write" or int(row["forwarders"]) < 1:
            continue
        runs[pattern_key(row)][int(row["forwarders"])].append(float(row["bandwidth"]))
    out = []
    for key in sorted(runs):
        processes, clients, layout, spatiality, request = key
        by_n = runs[key]
        ns = sorted(by_n)
        out.append(
            {
                "name": f"{processes}p-{clients}c-{layout}-{spatiality}-{request}k",
                "processes": processes,
                "clients": clients,
                "layout": layout,
                "spatiality": spatiality,
                "request_kib": request,
                "n": ns,
                "mean": [round(statistics.fmean(by_n[n]), 3) for n in ns],
                "sd": [
                    round(statistics.stdev(by_n[n]), 3) if len(by_n[n]) > 1 else 0.0 for n in ns
                ],
                "reps": [len(by_n[n]) for n in ns],
                "min": [round(min(by_n[n]), 3) for n in ns],
                "max": [round(max(by_n[n]), 3) for n in ns],
            }
        )
    return out


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True
    ).stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("repo", type=Path, help="a clone (bare or not) of " + REPOSITORY)
    parser.add_argument("--commit", default="HEAD")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    commit = git(args.repo, "rev-parse", f"{args.commit}^{{commit}}").strip()
    rows = list(
        csv.DictReader(io.StringIO(git(args.repo, "show", f"{commit}:{RESULTS}")), delimiter=";")
    )
    patterns = curves(rows)
    source = {
        "reference": "FORGE",
        "repository": REPOSITORY,
        "commit": commit,
        "file": RESULTS,
        "machine": "MareNostrum 4 (GPFS behind I/O forwarding nodes)",
        "operation": "write",
        "unit": "MB/s",
        "regenerate": "python bench/forge_curves.py REPO --commit " + commit,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    # one pattern per line: small, and a diff shows which pattern changed
    lines = [json.dumps(p, separators=(",", ":")) for p in patterns]
    head = json.dumps(source, indent=1)
    args.out.write_text('{"source": ' + head + ',\n"patterns": [\n' + ",\n".join(lines) + "\n]}\n")
    counts = sorted({n for p in patterns for n in p["n"]})
    json.dump(
        {
            "commit": commit,
            "rows": len(rows),
            "patterns": len(patterns),
            "counts": counts,
            "repetitions": sum(sum(p["reps"]) for p in patterns),
            "out": str(args.out),
        },
        sys.stdout,
        indent=1,
    )
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
