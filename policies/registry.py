"""Name → policy class registry, read by the controller, the REST API and the simulator.

Entries are lazy ``"module:Attr"`` strings so importing the registry imports no
policy; an unknown name that looks like ``"pkg.module:Class"`` is imported as a
path (uvicorn's alias habit), and third-party policies can register through the
``burstctl.policies`` entry-point group. Registering a taken name fails unless
``replace=True``: no silent overwrite.

Besides names, ``get`` accepts a ThemisIO sharing spec (``"group>user>size"``, or
one level such as ``"size"``; ``policies/statistical_tokens.py``): it resolves to
the class of that spec, whose ``name`` is the canonical spec. An invalid spec is
an ``UnknownPolicyError`` that names the offending level.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Mapping
from importlib.metadata import entry_points
from typing import Any

from pydantic import ValidationError

from burstctl.policies.base import Policy, PolicyParams

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
    """Maps kebab-case names to policy classes."""

    def __init__(self, entries: Mapping[str, str | type[Policy]] | None = None) -> None:
        self._entries: dict[str, str | type[Policy]] = {}
        for name, target in (entries if entries is not None else _BUILTIN).items():
            self.register(name, target)

    def register(self, name: str, target: str | type[Policy], *, replace: bool = False) -> None:
        if not _NAME.match(name):
            raise ValueError(f"policy names are kebab-case ([a-z0-9-]), got {name!r}")
        if name in self._entries and not replace:
            raise ValueError(f"policy {name!r} is already registered")
        self._entries[name] = target

    def load_entry_points(self) -> None:
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            if ep.name not in self._entries:
                self.register(ep.name, ep.value)

    def names(self) -> list[str]:
        return sorted(self._entries)

    def get(self, name: str) -> type[Policy]:
        target = self._entries.get(name)
        if target is None:
            spec_class = _spec_class(name)
            if spec_class is not None:
                return spec_class
            if ":" not in name:
                raise UnknownPolicyError(
                    f"unknown policy {name!r}; known: {', '.join(self.names())}; "
                    "or a sharing spec such as 'group>user>size'"
                )
            target = name
        if isinstance(target, str):
            cls = _import(target)
            if name in self._entries:
                self._entries[name] = cls
            return cls
        return target

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


def _import(path: str) -> type[Policy]:
    module_name, _, attr = path.partition(":")
    try:
        obj = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise UnknownPolicyError(f"cannot import policy {path!r}: {exc}") from None
    if not (isinstance(obj, type) and issubclass(obj, Policy)):
        raise UnknownPolicyError(f"{path!r} is not a Policy subclass")
    return obj


def default_registry() -> PolicyRegistry:
    """The built-in policies plus those installed through entry points."""
    registry = PolicyRegistry()
    registry.load_entry_points()
    return registry
