"""Fixtures of the fuzz tests: a controller process, a channel to it, an honest session."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from fuzz_support import FUZZ_ENV, HonestSession
from support import ControllerProcess


@pytest.fixture
def fuzz_controller(tmp_path: Path) -> Iterator[ControllerProcess]:
    """``burstctl controller`` in a child process with the fuzz lease and heartbeat timeout."""
    proc = ControllerProcess(
        tmp_path / "state",
        ["--capacity", "40MiB/s", "--node-bandwidth", "8MiB/s"],
        env=FUZZ_ENV,
    )
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def fuzz_channel(fuzz_controller: ControllerProcess) -> Iterator[grpc.Channel]:
    assert fuzz_controller.address is not None
    with grpc.insecure_channel(fuzz_controller.address) as channel:
        yield channel


@pytest.fixture
def honest(fuzz_channel: grpc.Channel) -> Iterator[HonestSession]:
    """The honest session, attached with a non-zero rate before the test starts fuzzing."""
    session = HonestSession(fuzz_channel).start()
    session.wait_rate()
    yield session
    session.stop()
