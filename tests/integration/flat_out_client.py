"""A client process for tests: one session of a job, acquiring flat out until killed.

Usage: python flat_out_client.py TARGET JOB_ID NODES
Prints "attached" once the controller has given it a rate.
"""

from __future__ import annotations

import sys

from burstctl.client import JobInfo, Session


def main() -> None:
    target, job_id, nodes = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with Session(target, JobInfo(job_id, "tester", "testers", nodes=nodes)) as session:
        announced = False
        while True:
            session.acquire(64 * 1024)
            if not announced and session.attached and session.rate > 0:
                print("attached", flush=True)
                announced = True


if __name__ == "__main__":
    main()
