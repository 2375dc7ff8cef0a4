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
        "stage_out",
        "evict",
    }
    for f in shared:
        theirs = cli_of(mount[f.name])
        assert f.default == mount[f.name].default, f.name
        assert cli_of(f).flags == theirs.flags, f.name
        if f.name not in ("controller", "stage_out"):  # each says what it drains: own help
            assert cli_of(f) == theirs, f.name
        else:
            assert dataclasses.replace(cli_of(f), help="") == dataclasses.replace(theirs, help="")


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


def test_stage_out_and_evict_as_the_mounts(tmp_path: Path) -> None:
    bb, pfs = tmp_path / "bb", tmp_path / "pfs"
    bb.mkdir()
    pfs.mkdir()
    config = AgentConfig(controller="h:1", paths=str(bb), stage_out=str(pfs))  # type: ignore[arg-type]
    assert config.stage_out == pfs and config.evict_mode == "after-copy"
    assert config.pfs_dir(str(bb)) == pfs
    kept = AgentConfig(controller="h:1", paths=str(bb), stage_out=pfs, evict="keep")
    assert kept.evict_mode == "keep"
    assert AgentConfig(controller="h:1", paths=str(bb)).evict_mode is None
    (tmp_path / "bb2").mkdir()
    two = AgentConfig(controller="h:1", paths=f"{bb},{tmp_path / 'bb2'}", stage_out=pfs)  # type: ignore[arg-type]
    assert two.pfs_dir(str(tmp_path / "bb2")) == pfs / "bb2"


@pytest.mark.parametrize(
    ("where", "message"),
    [
        ("bb/pfs", "inside --paths"),  # the drain would copy the buffer into itself
        (".", "contains --paths"),  # the copies would land on the buffer
        ("nowhere", "no such directory"),
    ],
)
def test_stage_out_refused_naming_the_flag(tmp_path: Path, where: str, message: str) -> None:
    (tmp_path / "bb" / "pfs").mkdir(parents=True)
    with pytest.raises(AgentError, match=f"--stage-out .*{message}"):
        AgentConfig(controller="h:1", paths=str(tmp_path / "bb"), stage_out=tmp_path / where)


def test_evict_needs_stage_out_and_several_paths_need_distinct_names(tmp_path: Path) -> None:
    for name in ("a/bb", "b/bb", "pfs"):
        (tmp_path / name).mkdir(parents=True)
    with pytest.raises(AgentError, match="--evict needs --stage-out"):
        AgentConfig(controller="h:1", paths=str(tmp_path / "a/bb"), evict="keep")
    with pytest.raises(AgentError, match="last names"):
        AgentConfig(
            controller="h:1",
            paths=f"{tmp_path / 'a/bb'},{tmp_path / 'b/bb'}",  # type: ignore[arg-type]
            stage_out=tmp_path / "pfs",
        )
