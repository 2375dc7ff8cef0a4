"""The node agent as a child process, for the preload shim's tests (conftest.py has the
fixtures that start and stop them)."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from support import ControllerProcess, clean_env, wait_until

# The test process's own job identity must not leak into what the children are booked to.
CLEAN = clean_env(("BURSTCTL_", "SLURM_"))


class AgentProcess:
    """``burstctl agent`` in a child process; its stderr is kept in ``log``."""

    def __init__(self, socket_path: Path, args: list[str], state: Path | None = None) -> None:
        """``state``: its XDG_STATE_HOME (the stage-out's journals), by default the runner's."""
        self.socket = socket_path
        self.log: list[str] = []
        env = CLEAN if state is None else {**CLEAN, "XDG_STATE_HOME": str(state)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "burstctl", "agent", "--socket", str(socket_path), *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self._drainer = threading.Thread(target=self._drain, daemon=True)
        self._drainer.start()

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line)

    @property
    def log_text(self) -> str:
        return "".join(self.log)

    def wait_ready(self) -> AgentProcess:
        wait_until(
            lambda: "agent listening on" in self.log_text or self.proc.poll() is not None,
            timeout=20,
            message="the agent to listen",
        )
        assert self.proc.poll() is None, self.log_text
        return self

    def request(self, message: bytes) -> str:
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
            sock.settimeout(5)
            sock.connect(str(self.socket))
            sock.send(message)
            return sock.recv(1 << 20).decode()

    def status(self) -> dict[str, Any]:
        answer = self.request(b"STATUS")
        assert answer.startswith("STATUS "), answer
        result: dict[str, Any] = json.loads(answer[len("STATUS ") :])
        return result

    def job(self, job_id: str) -> dict[str, Any] | None:
        return next((j for j in self.status()["jobs"] if j["job_id"] == job_id), None)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        self._drainer.join(timeout)
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        return self.proc.returncode


def agent_args(ctl: ControllerProcess, world: Path, *more: str) -> list[str]:
    assert ctl.address is not None
    return ["--controller", ctl.address, "--paths", str(world / "bb"), "--tick", "0.02", *more]
