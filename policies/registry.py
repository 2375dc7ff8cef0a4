"""Name → policy class registry, read by the controller, the REST API and the simulator.

Entries are lazy ``"module:Attr"`` strings so importing the registry imports no
policy. Third-party policies register through the ``burstctl.policies``
entry-point group of their distribution; an entry point is loaded when its name
is first used. A name is only ever looked up: a registered name, an entry
point's name or a sharing spec, never an import path (a name comes from
requests, peers and saved state). Registering a taken name fails unless
``replace=True``: no silent overwrite.

Besides names, ``get`` accepts a ThemisIO sharing spec (``"group>user>size"``, or
one level such as ``"size"``; ``policies/statistical_tokens.py``): it resolves to
the class of that spec, whose ``name`` is the canonical spec. An invalid spec is
an ``UnknownPolicyError`` that names the offending level.
"""

from __future__ import annotations

import importlib
import logging
import re
from collections.abc import Iterable, Mapping
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from pydantic import ValidationError

from burstctl.common.limits import MAX_TEXT
from burstctl.policies.base import Policy, PolicyParams

log = logging.getLogger(__name__)

_NAME = re.compile(r"^[a-z][a-z0-9]*(?:-[a-z0-9]+)*$")

_BUILTIN: dict[str, str] = {
    "fcfs": "burstctl.policies.fcfs:Fcfs",
    "fair-share": "burstctl.policies.fair_share:FairShare",
    "greedy-yield": "burstctl.policies.greedy:GreedyYield",
    "greedy-com": "burstctl.policies.greedy:GreedyCom",
    "periodic-greedy-yield": "burstctl.policies.greedy:PeriodicGreedyYield",
    "look-ahead-greedy-yield": "burstctl.policies.greedy:LookAheadGreedyYield",
    "set-10": "burstctl.policies.io_sets:Set10",
    "best-next-event": "burstctl.policies.best_next_event:BestNextEvent",
    "deficit-com": "burstctl.policies.deficit_com:DeficitCom",
    "persched": "burstctl.policies.persched.live:PerSchedLive",
    "dpsac": "burstctl.policies.dpsac.live:DpsacPolicy",
    # ThemisIO statistical tokens; the spec each name stands for is in the comment
    "job-fair": "burstctl.policies.statistical_tokens:JobFair",  # job
    "user-fair": "burstctl.policies.statistical_tokens:UserFair",  # user>job
    "group-fair": "burstctl.policies.statistical_tokens:GroupFair",  # group>job
    "size-fair": "burstctl.policies.statistical_tokens:SizeFair",  # size
    "priority-fair": "burstctl.policies.statistical_tokens:PriorityFair",  # priority
    "user-size-fair": "burstctl.policies.statistical_tokens:UserSizeFair",  # user>size
    "group-size-fair": "burstctl.policies.statistical_tokens:GroupSizeFair",  # group>size
    "group-user-fair": "burstctl.policies.statistical_tokens:GroupUserFair",  # group>user>job
    "group-user-size-fair": "burstctl.policies.statistical_tokens:GroupUserSizeFair",
}

ENTRY_POINT_GROUP = "burstctl.policies"

# What a name stands for: a built-in's "module:Attr", an entry point, or the loaded class
_Target = str | EntryPoint | type[Policy]


class UnknownPolicyError(KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


class PolicyParamsError(ValueError):
    """Parameters a policy does not accept; ``errors`` holds (location, message) pairs,
    the location a path inside the parameters (empty: the parameters as a whole)."""

    def __init__(self, name: str, errors: list[tuple[tuple[str | int, ...], str]]) -> None:
        problems = "; ".join(f"{'.'.join(map(str, loc)) or 'params'}: {msg}" for loc, msg in errors)
        super().__init__(f"bad parameters for policy {name!r}: {problems}")
        self.errors = errors


class PolicyRegistry:
    """Maps kebab-case names to policy classes.

    A name is registered by code (``register``: the built-ins, a test) or by an
    installed distribution's entry point of the ``burstctl.policies`` group
    (``load_entry_points``). A name given to ``get`` is looked up, never imported.
    """

    def __init__(self, entries: Mapping[str, str | type[Policy]] | None = None) -> None:
        self._entries: dict[str, _Target] = {}
        for name, target in (entries if entries is not None else _BUILTIN).items():
            self.register(name, target)

    def register(self, name: str, target: str | type[Policy], *, replace: bool = False) -> None:
        """Registers ``name``; a string ``target`` is a ``"module:Attr"`` path written in
        code (imported on first use), never one that came from a request."""
        if not _NAME.match(name):
            raise ValueError(f"policy names are kebab-case ([a-z0-9-]), got {name!r}")
        if name in self._entries and not replace:
            raise ValueError(f"policy {name!r} is already registered")
        self._entries[name] = target

    def load_entry_points(self, found: Iterable[EntryPoint] | None = None) -> None:
        """Registers the entry points of the ``burstctl.policies`` group of the installed
        distributions (``found``: these instead, for tests), loaded on first use. One
        that is not kebab-case or whose name is taken is skipped with a warning: a
        third-party package never replaces a built-in, nor stops the others."""
        for ep in entry_points(group=ENTRY_POINT_GROUP) if found is None else found:
            if not _NAME.match(ep.name):
                log.warning(
                    "policy entry point %r (%s) skipped: policy names are kebab-case",
                    ep.name,
                    ep.value,
                )
            elif ep.name in self._entries:
                log.warning(
                    "policy entry point %r (%s) skipped: the name is already registered",
                    ep.name,
                    ep.value,
                )
            else:
                self._entries[ep.name] = ep

    def names(self) -> list[str]:
        return sorted(self._entries)

    def get(self, name: str) -> type[Policy]:
        """The class of a registered name or of a sharing spec; ``UnknownPolicyError``
        (naming ``name``) for anything else. Imports only registered entries."""
        if not isinstance(name, str):
            raise UnknownPolicyError(f"a policy name is a string, got {type(name).__name__}")
        if len(name) > MAX_TEXT:
            raise UnknownPolicyError(
                f"unknown policy {name[:32]!r}...: longer than {MAX_TEXT} characters"
            )
        target = self._entries.get(name)
        if target is None:
            spec_class = _spec_class(name)
            if spec_class is not None:
                return spec_class
            raise UnknownPolicyError(self._unknown(name))
        if isinstance(target, type):
            return target
        cls = _load(name, target)
        self._entries[name] = cls
        return cls

    def _unknown(self, name: str) -> str:
        message = (
            f"unknown policy {name!r}; known: {', '.join(self.names())}; "
            "or a sharing spec such as 'group>user>size'"
        )
        if ":" in name:
            message += (
                f"; import paths are not policy names (a third-party policy is an entry "
                f"point of the {ENTRY_POINT_GROUP!r} group)"
            )
        return message

    def validate(self, name: str, params: Mapping[str, Any] | None = None) -> PolicyParams:
        """``params`` validated for ``name``; raises ``UnknownPolicyError`` or
        ``PolicyParamsError`` (a ValueError naming each bad field). Builds no policy."""
        cls = self.get(name)
        try:
            return cls.Params.model_validate(dict(params or {}))
        except ValidationError as exc:
            errors = [(tuple(e["loc"]), e["msg"]) for e in exc.errors(include_url=False)]
            raise PolicyParamsError(name, errors) from None

    def create(self, name: str, params: Mapping[str, Any] | None = None) -> Policy:
        """A new instance of ``name`` with validated ``params`` (see :meth:`validate`)."""
        return self.get(name)(self.validate(name, params))


def _spec_class(name: str) -> type[Policy] | None:
    """The class of a ThemisIO sharing spec (one per canonical spec); None if ``name``
    is not meant as a spec (no ``>`` and not a single level name)."""
    from burstctl.policies import statistical_tokens as tokens  # lazy, as every entry

    if not tokens.is_spec(name):
        return None
    try:
        return tokens.policy_class(name)
    except tokens.SpecError as exc:
        raise UnknownPolicyError(str(exc)) from None


def _load(name: str, target: str | EntryPoint) -> type[Policy]:
    """The class a registered entry stands for: a built-in's path or an entry point."""
    if isinstance(target, str):  # a built-in: a path written above, importable
        module_name, _, attr = target.partition(":")
        obj = getattr(importlib.import_module(module_name), attr)
        where = target
    else:
        where = f"entry point {target.value!r}"
        try:
            obj = target.load()
        except Exception as exc:  # third-party code: whatever its import raises
            raise UnknownPolicyError(
                f"policy {name!r}: {where} cannot be loaded: {type(exc).__name__}: {exc}"
            ) from None
    if not (isinstance(obj, type) and issubclass(obj, Policy)):
        raise UnknownPolicyError(f"policy {name!r}: {where} is not a Policy subclass")
    cls: type[Policy] = obj
    if cls.allocate is Policy.allocate or not isinstance(getattr(cls, "name", None), str):
        raise UnknownPolicyError(
            f"policy {name!r}: {where} is not a concrete policy (it needs a name and allocate)"
        )
    return cls


def default_registry() -> PolicyRegistry:
    """The built-in policies plus those installed through entry points."""
    registry = PolicyRegistry()
    registry.load_entry_points()
    return registry
