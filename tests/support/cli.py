"""The command line in this process: click's runner over ``burstctl.cli.main``, the same
commands as ``python -m burstctl`` without an interpreter started per call (a test of what
a process does, its signals, its exit on a kill, uses ``run_burstctl``).

An exception the command does not turn into an exit status is raised into the test, not
kept in the result: a traceback is never a passing "error message".
"""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner, Result

from burstctl.cli import main


def invoke(*args: str | Path) -> Result:
    """``burstctl ARGS``; ``exit_code``, ``stdout`` and ``stderr`` apart."""
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
