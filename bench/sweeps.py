"""The long sweeps of the suite (pytest marker ``sweep``), which ``make test`` leaves out.

Runs ``pytest -m sweep`` over tests/ (hypothesis at its ``thorough`` profile, as
``make test-all``) and prints JSON: how many sweep tests ran, passed, failed and were
skipped, the wall time, and each failure's node id. Exits with pytest's status.

    python bench/sweeps.py [-k EXPR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-k", dest="keyword", help="only the sweep tests matching EXPR")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="burstctl-sweeps-") as tmp:
        report = Path(tmp) / "junit.xml"
        command = [sys.executable, "-m", "pytest", "-q", "-m", "sweep", f"--junitxml={report}"]
        if args.keyword:
            command += ["-k", args.keyword]
        started = time.perf_counter()
        done = subprocess.run(
            command, cwd=ROOT, env={**os.environ, "HYPOTHESIS_PROFILE": "thorough"}, check=False
        )
        wall = time.perf_counter() - started
        cases = ET.parse(report).getroot().iter("testcase") if report.exists() else iter(())
        failed, skipped, ran = [], 0, 0
        for case in cases:
            ran += 1
            if case.find("failure") is not None or case.find("error") is not None:
                failed.append(f"{case.get('classname')}::{case.get('name')}")
            elif case.find("skipped") is not None:
                skipped += 1
    print(
        json.dumps(
            {
                "bench": "sweeps",
                "tests": ran,
                "passed": ran - len(failed) - skipped,
                "failed": failed,
                "skipped": skipped,
                "wall_seconds": round(wall, 1),
                "pytest_status": done.returncode,
            }
        )
    )
    # 5: no test was selected (no sweep yet matches -k): not a failure of the sweeps
    return 0 if done.returncode in (0, 5) else done.returncode


if __name__ == "__main__":
    raise SystemExit(main())
