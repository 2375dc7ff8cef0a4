"""The fuzz tests of tests/fuzz, long: many more examples and bigger floods than in the suite.

1. The Session state machine (tests/fuzz/test_session_machine.py) against a fresh
   ``burstctl controller`` process with an honest session alongside, ``--examples``
   examples, floods of ``--flood-min``..``--flood-max`` unknown completions per flood step.
2. The gRPC garbage and REST schema tests (tests/fuzz/test_grpc_garbage.py,
   tests/fuzz/test_rest_schema.py) under pytest with the long hypothesis profile
   (``BURSTCTL_FUZZ_PROFILE=long``).

Prints one JSON object: for the machine, its duration, the controller's RSS growth (MiB,
peak over the run minus the level before it; the bound is 50 MiB), the first harm to the
honest session and the failure hypothesis reported, if any; for each pytest test, its
outcome and duration. Every controller is stopped by pid.

    python bench/fuzz_long.py [--examples 2000] [--flood-min 200] [--flood-max 20000]
        [--skip-pytest]
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
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FUZZ = ROOT / "tests" / "fuzz"
sys.path[:0] = [str(FUZZ), str(ROOT / "tests")]

import grpc  # noqa: E402
from fuzz_support import FUZZ_ENV, HonestSession  # noqa: E402
from hypothesis import settings  # noqa: E402
from support import ControllerProcess  # noqa: E402
from test_session_machine import RSS_BOUND, run_machine  # noqa: E402

MiB = 1 << 20


def machine(args: argparse.Namespace) -> dict[str, Any]:
    settings.register_profile(
        "fuzz-bench", max_examples=args.examples, deadline=None, print_blob=True
    )
    with tempfile.TemporaryDirectory(prefix="burstctl-fuzz-") as tmp:
        controller = ControllerProcess(Path(tmp) / "state", [], env=FUZZ_ENV).start()
        try:
            assert controller.address is not None
            with grpc.insecure_channel(controller.address) as channel:
                honest = HonestSession(channel).start()
                honest.wait_rate()
                t0 = time.monotonic()
                run = run_machine(
                    controller, channel, honest, "fuzz-bench", (args.flood_min, args.flood_max)
                )
                elapsed = time.monotonic() - t0
                harm_after = honest.harm()
                honest.stop()
            alive = controller.proc is not None and controller.proc.poll() is None
        finally:
            code = controller.stop()
    return {
        "examples": args.examples,
        "flood": [args.flood_min, args.flood_max],
        "elapsed_s": round(elapsed, 1),
        "controller_alive_at_end": alive,
        "controller_exit_code": code,
        "rss_growth_mib": round(run.rss_growth / MiB, 2),
        "rss_bound_mib": RSS_BOUND / MiB,
        "honest_harm": run.harms[0] if run.harms else harm_after,
        "failure": None if run.error is None else f"{type(run.error).__name__}: {run.error}",
        "ok": run.error is None and not run.harms and run.rss_growth < RSS_BOUND,
    }


def pytest_tests(args: argparse.Namespace) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="burstctl-fuzz-") as tmp:
        junit = Path(tmp) / "junit.xml"
        env = {**os.environ, "BURSTCTL_FUZZ_PROFILE": "long"}
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "--timeout",
                str(args.pytest_timeout),
                f"--junitxml={junit}",
                str(FUZZ / "test_grpc_garbage.py"),
                str(FUZZ / "test_rest_schema.py"),
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            check=False,
        )
        out = []
        for case in ET.parse(junit).getroot().iter("testcase"):
            outcome = "passed"
            detail = None
            for tag in ("failure", "error", "skipped"):
                node = case.find(tag)
                if node is not None:
                    outcome = tag
                    detail = (node.get("message") or "")[:500]
            out.append(
                {
                    "test": case.get("name"),
                    "outcome": outcome,
                    "seconds": round(float(case.get("time", 0)), 1),
                    "detail": detail,
                }
            )
        return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=2000, help="state machine examples")
    parser.add_argument("--flood-min", type=int, default=200)
    parser.add_argument("--flood-max", type=int, default=20_000)
    parser.add_argument("--pytest-timeout", type=int, default=3600)
    parser.add_argument("--skip-pytest", action="store_true", help="only the state machine")
    args = parser.parse_args(argv)
    report: dict[str, Any] = {"benchmark": "fuzz_long", "session_machine": machine(args)}
    if not args.skip_pytest:
        report["pytest"] = pytest_tests(args)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
