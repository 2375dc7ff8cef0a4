"""`AgentConfig`: the options it shares with the mount are spelled and defaulted as the mount's
(both from `burstctl.node.options`), and bad values are refused naming the flag."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from burstctl.fuse_shim.config import MountConfig
from burstctl.node.options import cli_of
from burstctl.preload_shim.config import AgentConfig, AgentError


def test_shared_options_are_spelled_and_defaulted_as_the_mounts() -> None:
    mount = {f.name: f for f in dataclasses.fields(MountConfig)}
    shared = [f for f in dataclasses.fields(AgentConfig) if f.name in mount]
    assert {f.name for f in shared} >= {
        "controller",
        "fallback",
        "tls_ca",
        "secret_file",
        "quiet_gap",
        "session_idle",
        "attach_timeout",
        "fallback_grace",
    }
    for f in shared:
        theirs = cli_of(mount[f.name])
        assert f.default == mount[f.name].default, f.name
        assert cli_of(f).flags == theirs.flags, f.name
        if f.name != "controller":  # required here: its own help
            assert cli_of(f) == theirs, f.name


def test_paths_from_the_command_line(tmp_path: Path) -> None:
    (tmp_path / "b").mkdir()
    config = AgentConfig(controller="h:1", paths=f"{tmp_path},{tmp_path / 'b'}")  # type: ignore[arg-type]
    assert config.paths == (str(tmp_path), str(tmp_path / "b"))
    assert config.metadata_cost == 0 and config.stage_out is None


@pytest.mark.parametrize(
    ("values", "flag"),
    [
        ({"paths": "/tmp"}, "--controller"),
        ({"controller": "h:1"}, "--paths"),
        ({"controller": "h:1", "paths": "/tmp,rel"}, "--paths"),
        ({"controller": "h:1", "paths": "/tmp", "socket": Path("rel.sock")}, "--socket"),
        ({"controller": "h:1", "paths": "/tmp", "tick": 0.0}, "--tick"),
        ({"controller": "h:1", "paths": "/tmp", "quiet_gap": -1.0}, "--quiet-gap"),
        ({"controller": "h:1", "paths": "/tmp", "fallback": "sometimes"}, "--fallback"),
    ],
)
def test_bad_values_name_their_flag(values: dict[str, object], flag: str) -> None:
    with pytest.raises(AgentError, match=flag):
        AgentConfig(**values)  # type: ignore[arg-type]
