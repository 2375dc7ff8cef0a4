"""The only durable state of a replica: the active policy and the registered jobs.

Kept as JSON in ``<state_dir>/state.json``, written atomically (temp file,
fsync, rename, fsync of the directory) so a crash leaves the old or the new
file, never a torn one. A missing file means "no state yet"; an unreadable one
is reported and left in place, never overwritten blindly.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

STATE_FILE = "state.json"


class PolicyState(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    params: dict[str, Any] = Field(default_factory=dict)
    version: int = 0


class RegisteredJob(BaseModel):
    """A job registered through the admin API (a Slurm prolog): authoritative metadata."""

    model_config = ConfigDict(extra="forbid")
    job_id: str
    user: str
    group: str
    nodes: int
    priority: float = 1.0


class ReplicaState(BaseModel):
    model_config = ConfigDict(extra="ignore")
    policy: PolicyState | None = None
    jobs: list[RegisteredJob] = Field(default_factory=list)


class StateError(RuntimeError):
    pass


class StateStore:
    def __init__(self, state_dir: Path) -> None:
        self.dir = state_dir
        self.path = state_dir / STATE_FILE

    def load(self) -> ReplicaState:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return ReplicaState()
        except OSError as exc:
            raise StateError(f"cannot read {self.path}: {exc}") from None
        try:
            return ReplicaState.model_validate_json(text)
        except ValidationError as exc:
            raise StateError(f"{self.path} is not valid burstctl state: {exc}") from None

    def save(self, state: ReplicaState) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        data = json.dumps(state.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"
        fd, tmp = tempfile.mkstemp(prefix=".state-", dir=self.dir)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        dir_fd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
