"""The durable state of a replica and the one owner of its active policy.

``StateStore`` keeps ``<state_dir>/state.json``: the active policy (name,
parameters, version), the policy the configuration named when it was saved, and
the registered jobs (with their retirements and the catalog's version clock,
controller/catalog.py). It is a ``DurableFile`` (common/files.py): written
atomically (temp file, fsync, rename, fsync of the directory) so a crash leaves
the old or the new file, never a torn one; a missing file means "no state yet";
an unreadable one is kept aside (``state.json.unreadable-<n>``, logged) and the
replica starts with the configured policy and no registered jobs.

``PolicySlot`` owns the active policy: its name and parameters, its version
(higher wins across replicas, ties to the higher replica id), when it was
applied, the one live instance that decides (locally and for the global split,
so a policy that learns keeps one state), and its persistence. ``switch`` is
for an operator (REST, CLI); ``adopt`` for a peer's newer version. Whoever must
act on a change connects to the ``changed`` signal: the scheduler decides again,
the peer exchange sends at once.

Restart rules (docs/configuration.md, "Restarts"): a policy switched through the
API survives a restart with the same configuration; the configured policy is
the initial one; when the configured policy differs from the one recorded with
the saved state, the operator edited it and the edit wins (logged). A saved
policy the registry cannot build (an unknown name, an import path, parameters
out of range) never stops a start: the configured policy is used, with a warning.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from burstctl.common.files import DurableFile
from burstctl.controller.signal import Signal
from burstctl.policies.base import Offload, Policy
from burstctl.policies.registry import PolicyRegistry

log = logging.getLogger(__name__)

_POLICY_WORK = ThreadPoolExecutor(max_workers=1, thread_name_prefix="burstctl-policy")


def offload_to_thread(work: Callable[[], Any], done: Callable[[Any], None]) -> None:
    """A policy's slow work (PerSched's pattern) in a thread of its own, not the loop's
    default pool (threads blocked there would starve it); ``done`` gets its result on the
    running loop (``Policy.use_offload``, given by the replica's ``PolicySlot``)."""
    future = asyncio.get_running_loop().run_in_executor(_POLICY_WORK, work)

    def finished(f: asyncio.Future[Any]) -> None:
        if f.cancelled():
            return
        try:
            done(f.result())
        except Exception:  # a policy bug must not stop the controller
            log.exception("offloaded policy work failed")

    future.add_done_callback(finished)


STATE_FILE = "state.json"


class PolicyState(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    params: dict[str, Any] = Field(default_factory=dict)
    version: int = 0
    origin: str | None = None  # the replica that switched it (None: this one)


class ConfiguredPolicy(BaseModel):
    """The policy the configuration named when the state was saved."""

    model_config = ConfigDict(extra="forbid")
    name: str
    params: dict[str, Any] = Field(default_factory=dict)


class RegisteredJob(BaseModel):
    """A job registered through the admin API (a Slurm prolog): authoritative metadata."""

    model_config = ConfigDict(extra="forbid")
    job_id: str
    user: str = ""  # "" (and nodes 0): a retirement
    group: str = ""
    nodes: int = 0
    priority: float = 1.0
    w: float = 0.0  # a declared period (policy persched); 0: none
    vol_io: float = 0.0
    app: str = ""  # application name of its profile (controller/profiles.py); "": none
    # Its catalog record (controller/catalog.py); version 0: saved by an older burstctl.
    version: int = 0
    origin: str = ""
    changed_at: float = 0.0  # the origin's wall clock when it made this version
    retired: bool = False  # a tombstone: retired, remembered so peers learn it


class SavedRule(BaseModel):
    """A rule's catalog record as ``state.json`` keeps it."""

    model_config = ConfigDict(extra="forbid")
    name: str
    rank: int = 100  # controller/rules.py DEFAULT_RANK
    job: str = ""
    user: str = ""
    group: str = ""
    app: str = ""
    limit: float = 0.0
    reservation: float = 0.0
    weight: float = 1.0
    metadata_ops: float = 0.0
    version: int = 1
    origin: str = ""
    changed_at: float = 0.0
    removed: bool = False  # a tombstone, remembered so peers learn it


class ReplicaState(BaseModel):
    model_config = ConfigDict(extra="ignore")
    policy: PolicyState | None = None
    configured: ConfiguredPolicy | None = None  # None: saved by an older burstctl
    jobs: list[RegisteredJob] = Field(default_factory=list)
    catalog_clock: int = 0  # the highest catalog version this replica had seen
    rules: list[SavedRule] = Field(default_factory=list)  # operator rules (controller/rules.py)


class StateStore:
    """``state.json`` of one replica; ``state`` is what was last loaded or saved."""

    def __init__(self, state_dir: Path) -> None:
        self.file = DurableFile(state_dir / STATE_FILE, "the replica's state")
        self.state = ReplicaState()

    @property
    def path(self) -> Path:
        return self.file.path

    def load(self) -> ReplicaState:
        """Reads the file; a missing one, or an unreadable one (kept aside), is an empty
        state."""
        self.state = self.file.load(ReplicaState.model_validate_json) or ReplicaState()
        return self.state

    def update(self, **parts: Any) -> None:
        """Writes the state with ``parts`` replaced; on OSError nothing changed."""
        state = ReplicaState.model_validate({**dict(self.state), **parts})
        self.file.save(json.dumps(state.model_dump(mode="json"), indent=2, sort_keys=True) + "\n")
        self.state = state


class ActivePolicy(BaseModel):
    """The active policy of one replica, as the admin API shows it."""

    name: str
    params: dict[str, Any]
    version: int = Field(description="higher wins across replicas; ties go to the higher origin")
    origin: str = Field(description="the replica where this version was switched")
    since: datetime = Field(description="when this replica applied it")
    replica_id: str


class PolicySlot:
    """The active policy of one replica: the only holder of its name, parameters,
    version and live instance (module docstring).

    ``(version, origin)`` orders policies across replicas: ``origin`` is the replica
    where the version was switched, so every replica that holds it elects the
    same one whichever replicas are live.
    """

    def __init__(
        self,
        registry: PolicyRegistry,
        store: StateStore,
        configured: tuple[str, Mapping[str, Any]],
        *,
        replica_id: str,
        wall_clock: Callable[[], float] = time.time,
        offload: Offload | None = None,
    ) -> None:
        self.registry = registry
        self.replica_id = replica_id
        # Where the policies this slot builds run their slow work (``Policy.use_offload``,
        # given as each is built); None: in the decision (tests, benchmarks).
        self._offload = offload
        # After offloaded work landed in the active policy: a decision should follow.
        self.worked = Signal()
        self._store = store
        self._wall_clock = wall_clock
        name, params = configured
        self._configured = ConfiguredPolicy(name=name, params=dict(params))
        # The configured policy must be usable: a configuration error, raised here.
        self.policy: Policy = self._create(name, params)
        self._twin: tuple[Policy, Policy] | None = None  # (active, its twin): ``merged``
        self.name = name
        self.params: dict[str, Any] = dict(params)
        self.version = 0
        self.origin = replica_id
        self.since = wall_clock()  # wall clock of the last change, for the admin views
        self.switches = 0  # changes of name or parameters applied here
        self._highest_seen = 0  # the highest version any peer has reported
        self.changed = Signal()  # after every change of the active policy or its version

    @property
    def merged(self) -> Policy:
        """The instance that decides the merged view of several replicas: the active one,
        or for a policy that keeps state built from its views (``Policy.keeps_state``) a twin
        with the same name and parameters, made once per active instance."""
        policy = self.policy
        if not type(policy).keeps_state:
            return policy
        twin = self._twin
        if twin is None or twin[0] is not policy:
            twin = self._twin = (policy, self._create(self.name, self.params))
        return twin[1]

    def _create(self, name: str, params: Mapping[str, Any] | None) -> Policy:
        """A new instance of ``name``, given where to run its slow work."""
        policy = self.registry.create(name, params)
        if self._offload is not None:
            policy.use_offload(self._offload_then_decide)
        return policy

    def _offload_then_decide(self, work: Callable[[], Any], done: Callable[[Any], None]) -> None:
        assert self._offload is not None

        def landed(result: Any) -> None:
            try:
                done(result)
            finally:
                self.worked()

        self._offload(work, landed)

    @property
    def spec(self) -> tuple[str, dict[str, Any]]:
        return self.name, self.params

    def active(self) -> ActivePolicy:
        return ActivePolicy(
            name=self.name,
            params=self.params,
            version=self.version,
            origin=self.origin,
            since=datetime.fromtimestamp(self.since, UTC),
            replica_id=self.replica_id,
        )

    def resume(self, saved: ReplicaState) -> None:
        """Applies the restart rules to the state loaded at start (module docstring)."""
        configured = self._configured
        if saved.policy is None:
            return
        if saved.configured is not None and saved.configured != configured:
            log.warning(
                "the configured policy changed from %s %s to %s %s since %s was saved: "
                "the configured one wins over the saved %s (version %d)",
                saved.configured.name,
                saved.configured.params,
                configured.name,
                configured.params,
                self._store.path,
                saved.policy.name,
                saved.policy.version,
            )
            version = saved.policy.version + 1
            self._install(self.policy, configured.name, configured.params, version, self.replica_id)
            return
        try:
            policy = self._create(saved.policy.name, saved.policy.params)
        except Exception as exc:  # whatever it is, a saved policy never stops a start
            log.warning(
                "saved policy %r is unusable (%s); starting with the configured %s "
                "(%s keeps the saved one, parameters %s, until the next change)",
                saved.policy.name,
                exc,
                self.name,
                self._store.path,
                saved.policy.params,
            )
            return
        origin = saved.policy.origin or self.replica_id
        self._apply(
            policy,
            saved.policy.name,
            saved.policy.params,
            saved.policy.version,
            origin,
            counted=False,
        )
        log.info(
            "resumed policy %s (version %d) from %s",
            saved.policy.name,
            saved.policy.version,
            self._store.path,
        )

    def switch(self, name: str, params: Mapping[str, Any] | None = None) -> ActivePolicy:
        """An operator's switch: validated, persisted, applied at once, announced.

        Raises ``UnknownPolicyError`` or ``PolicyParamsError`` (nothing changes) and
        ``OSError`` when the state cannot be written (nothing changes either). The new
        version is one above any this replica or its peers have used, so the switch
        wins over every replica's current policy.
        """
        policy = self._create(name, params)
        version = max(self.version, self._highest_seen) + 1
        self._install(policy, name, dict(params or {}), version, self.replica_id)
        log.info("policy switched to %s (version %d)", name, version)
        return self.active()

    def adopt(self, name: str, params: Mapping[str, Any], version: int, origin: str) -> bool:
        """A peer's policy, from an accepted digest; it becomes this replica's when its
        ``(version, origin)`` is higher. True if anything changed. Peers' digests are
        checked before they get here; a policy the registry cannot build still raises
        ``UnknownPolicyError`` or ``PolicyParamsError`` here and changes nothing, not
        even the highest version seen."""
        params = dict(params)
        newer = (version, origin) > (self.version, self.origin)
        same = (name, params) == self.spec
        policy = self._create(name, params) if newer and not same else self.policy
        self._highest_seen = max(self._highest_seen, version)
        if not newer:
            return False
        if same and version == self.version:
            self.origin = origin  # the same policy, credited to another replica: nothing to apply
            return False
        self._install(policy, name, params, version, origin)
        log.info("policy %s (version %d, from %r) adopted", name, version, origin)
        return True

    def _install(
        self, policy: Policy, name: str, params: dict[str, Any], version: int, origin: str
    ) -> None:
        # Persist first: a restart must never resume an older policy than the one applied.
        self._store.update(
            policy=PolicyState(name=name, params=params, version=version, origin=origin),
            configured=self._configured,
        )
        self._apply(policy, name, params, version, origin)

    def _apply(
        self,
        policy: Policy,
        name: str,
        params: dict[str, Any],
        version: int,
        origin: str,
        *,
        counted: bool = True,
    ) -> None:
        if (name, params) != self.spec:
            self.switches += counted
            self.since = self._wall_clock()
        self.policy, self.name, self.params = policy, name, dict(params)
        self.version, self.origin = version, origin
        self.changed()
