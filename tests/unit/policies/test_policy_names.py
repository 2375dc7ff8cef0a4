"""Policy names are registry names (issue 15, finding 2): a built-in name, an entry point
of the ``burstctl.policies`` group, or a sharing spec; never an import path. And every
parameter of every registered policy has a range that ``validate`` checks."""

from __future__ import annotations

import importlib
import math
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from burstctl.common.limits import MAX_JOBS, MAX_TEXT
from burstctl.policies.base import Policy
from burstctl.policies.greedy import MAX_DELTA, MIN_DELTA
from burstctl.policies.io_sets import MAX_OMEGA, MIN_OMEGA
from burstctl.policies.registry import (
    ENTRY_POINT_GROUP,
    PolicyParamsError,
    UnknownPolicyError,
    default_registry,
)

IMPORT_PATHS = [
    "this:x",
    "..:x",
    ".:x",
    ":x",
    ":",
    "burstctl.policies.base:Policy",
    "burstctl.policies.fcfs:Fcfs",
    "burstctl.policies.view:JobView",
    "os:system",
    "this",
]


@pytest.mark.parametrize("name", IMPORT_PATHS)
def test_an_import_path_is_not_a_policy_name(name: str) -> None:
    had_this = "this" in sys.modules
    registry = default_registry()
    for call in (registry.get, registry.validate, registry.create):
        with pytest.raises(UnknownPolicyError, match="unknown policy") as raised:
            call(name)
        assert repr(name) in str(raised.value)
    assert ("this" in sys.modules) == had_this  # nothing was imported


def test_an_import_path_imports_nothing(probe: str) -> None:
    registry = default_registry()
    with pytest.raises(UnknownPolicyError, match="import paths are not policy names"):
        registry.create(f"{probe}:Probe")
    assert probe not in sys.modules
    assert importlib.import_module(probe).Probe.name == "probe"  # it was importable


def test_an_overlong_name_is_refused_without_echoing_it() -> None:
    name = "group>" * 100_000 + "job"
    with pytest.raises(UnknownPolicyError, match=f"longer than {MAX_TEXT}") as raised:
        default_registry().get(name)
    assert len(str(raised.value)) < 1000


def test_names_and_sharing_specs_still_resolve() -> None:
    registry = default_registry()
    assert registry.get("fcfs").name == "fcfs"
    assert registry.get("group > user > size").name == "group>user>size"
    with pytest.raises(UnknownPolicyError, match="level 2"):
        registry.get("group>nobody")


# -- entry points: a real distribution on sys.path ---------------------------------------


@pytest.fixture
def third_party(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An installed distribution (a dist-info directory on sys.path) whose entry points
    in the ``burstctl.policies`` group name a good policy, a badly named one, one that
    cannot be imported and one that is no usable policy. Yields the module's name."""
    module = f"thirdparty_{uuid.uuid4().hex}"
    (tmp_path / f"{module}.py").write_text(
        textwrap.dedent(
            """
            from pydantic import Field

            from burstctl.policies.base import Policy, PolicyParams
            from burstctl.policies.fair_share import FairShare


            class Params(PolicyParams):
                weight: float = Field(1.0, ge=0.5, le=2.0, allow_inf_nan=False)


            class ThirdParty(FairShare):
                name = "third-party"
                Params = Params


            class NotAPolicy:
                pass
            """
        )
    )
    dist = tmp_path / "burstctl_thirdparty-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: burstctl-thirdparty\nVersion: 1.0\n"
    )
    (dist / "entry_points.txt").write_text(
        textwrap.dedent(
            f"""
            [{ENTRY_POINT_GROUP}]
            third-party = {module}:ThirdParty
            Bad_Name = {module}:ThirdParty
            fcfs = {module}:ThirdParty
            broken = {module}_missing:Nope
            not-a-policy = {module}:NotAPolicy
            abstract = burstctl.policies.base:Policy

            [some.other.group]
            other = {module}:ThirdParty
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    yield module
    sys.modules.pop(module, None)


def test_an_entry_point_is_a_policy_name_loaded_on_first_use(
    third_party: str, caplog: pytest.LogCaptureFixture
) -> None:
    registry = default_registry()
    names = registry.names()
    assert {"third-party", "broken", "not-a-policy", "abstract"} <= set(names)
    assert "Bad_Name" not in names and "other" not in names
    assert "'Bad_Name'" in caplog.text  # skipped, and said so
    assert third_party not in sys.modules  # lazy: nothing imported to list the names
    policy = registry.create("third-party", {"weight": 1.5})
    assert type(policy).__module__ == third_party and policy.name == "third-party"
    with pytest.raises(PolicyParamsError, match="weight"):
        registry.validate("third-party", {"weight": 3.0})
    # a built-in name is never taken over by an entry point
    assert registry.get("fcfs").__module__ == "burstctl.policies.fcfs"
    assert "'fcfs'" in caplog.text


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("broken", "cannot be loaded"),
        ("not-a-policy", "not a Policy subclass"),
        ("abstract", "not a concrete policy"),
    ],
)
def test_an_unusable_entry_point_is_an_unknown_policy(
    third_party: str, name: str, why: str
) -> None:
    registry = default_registry()
    with pytest.raises(UnknownPolicyError, match=why) as raised:
        registry.create(name)
    assert repr(name) in str(raised.value)


def test_the_module_of_an_entry_point_is_no_name_either(third_party: str) -> None:
    with pytest.raises(UnknownPolicyError, match="unknown policy"):
        default_registry().get(f"{third_party}:ThirdParty")
    assert third_party not in sys.modules


# -- parameter ranges ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "delta", [1e-300, 5e-324, 1e-9, MIN_DELTA / 2, MAX_DELTA * 2, 1e300, math.inf, math.nan]
)
def test_delta_out_of_range_is_refused_naming_it(delta: float) -> None:
    with pytest.raises(PolicyParamsError) as raised:
        default_registry().create("periodic-greedy-yield", {"delta": delta})
    assert [loc for loc, _ in raised.value.errors] == [("delta",)]


@pytest.mark.parametrize("delta", [MIN_DELTA, 0.25, MAX_DELTA])
def test_delta_in_range_is_accepted(delta: float) -> None:
    policy = default_registry().create("periodic-greedy-yield", {"delta": delta})
    assert policy.params.delta == delta  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("known", "loc"),
    [
        ({"a": MIN_OMEGA / 2}, ("known_omega", "a")),
        ({"a": MAX_OMEGA * 2}, ("known_omega", "a")),
        ({"a": 1e-300}, ("known_omega", "a")),
        ({"": 5.0}, ("known_omega", "", "[key]")),
        ({"x" * (MAX_TEXT + 1): 5.0}, ("known_omega", "x" * (MAX_TEXT + 1), "[key]")),
        ({"a\n": 5.0}, ("known_omega", "a\n", "[key]")),
    ],
)
def test_known_omega_out_of_range_is_refused_naming_it(
    known: dict[str, float], loc: tuple[str, ...]
) -> None:
    with pytest.raises(PolicyParamsError) as raised:
        default_registry().create("set-10", {"known_omega": known})
    assert [e for e, _ in raised.value.errors] == [loc]


def test_known_omega_holds_at_most_max_jobs() -> None:
    known = {f"j{i}": 5.0 for i in range(MAX_JOBS + 1)}
    with pytest.raises(PolicyParamsError, match="known_omega"):
        default_registry().create("set-10", {"known_omega": known})
    known.pop("j0")
    assert len(default_registry().create("set-10", {"known_omega": known}).params.known_omega) == (  # type: ignore[attr-defined]
        MAX_JOBS
    )


def _numbers(
    schema: dict[str, Any], defs: dict[str, Any], path: str
) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every number or integer in a JSON schema, with its path."""
    if "$ref" in schema:
        schema = defs[schema["$ref"].rsplit("/", 1)[-1]]
    kind = schema.get("type")
    if kind in ("number", "integer"):
        yield path, schema
    for key, sub in schema.get("properties", {}).items():
        yield from _numbers(sub, defs, f"{path}.{key}" if path else key)
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _numbers(schema["additionalProperties"], defs, f"{path}[*]")
    if isinstance(schema.get("items"), dict):
        yield from _numbers(schema["items"], defs, f"{path}[*]")
    for sub in schema.get("anyOf", []):
        yield from _numbers(sub, defs, path)


def test_every_numeric_parameter_of_every_policy_is_bounded_and_documented() -> None:
    registry = default_registry()
    docs = (Path(__file__).resolve().parents[3] / "docs" / "policies.md").read_text()
    checked = 0
    for name in registry.names():
        cls: type[Policy] = registry.get(name)
        schema = cls.Params.model_json_schema()
        for path, number in _numbers(schema, schema.get("$defs", {}), ""):
            assert {"minimum", "exclusiveMinimum"} & set(number), (name, path)
            assert "maximum" in number, (name, path)
            assert f"`{path.split('.')[0].split('[')[0]}`" in docs, (name, path)
            checked += 1
    assert checked >= 2  # delta and known_omega at least
