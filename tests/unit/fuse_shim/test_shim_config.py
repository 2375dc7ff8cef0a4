"""`MountConfig` is the one owner of the mount's options: the CLI reads names, defaults, help."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner
from support import clean_env

from burstctl.cli import main
from burstctl.fuse_shim.config import DIRECT_IO_MODES, MountConfig, MountError
from burstctl.node.options import cli_of, format_size


def mount_command_params() -> dict[str, click.Parameter]:
    command = main.get_command(click.Context(main), "mount")
    assert command is not None
    params = command.get_params(click.Context(command))
    return {p.name: p for p in params if "--help" not in p.opts and p.name is not None}


def shown_default(f: dataclasses.Field[Any]) -> str:
    """How --help must show the default of ``f``."""
    spec = cli_of(f)
    if isinstance(spec.show_default, str):
        return spec.show_default
    if spec.kind == "size":
        return format_size(f.default)
    if spec.kind == "switch":
        return spec.flags[0].split("/")[0 if f.default else 1].removeprefix("--")
    return str(f.default)


def test_every_option_of_the_mount_command_is_a_field_with_its_default_and_help() -> None:
    params = mount_command_params()
    fields = dataclasses.fields(MountConfig)
    assert list(params) == [f.name for f in fields]
    for f in fields:
        spec, param = cli_of(f), params[f.name]
        if spec.kind == "argument":
            assert isinstance(param, click.Argument)
            continue
        assert isinstance(param, click.Option)
        assert param.help is not None and param.help.startswith(spec.help), f.name
        assert set(spec.flags[0].split("/")) <= set(param.opts + param.secondary_opts)
        assert param.envvar == spec.envvar
        default = param.default
        if spec.kind == "size" and default is not None:
            default = param.process_value(click.Context(main), default)
        assert default == f.default, f.name


def test_help_shows_every_option_with_its_default() -> None:
    result = CliRunner().invoke(
        main, ["mount", "--help"], terminal_width=1000, max_content_width=1000
    )
    assert result.exit_code == 0, result.output
    lines: dict[str, str] = {}  # first flag -> its entry (a long one continues on a new line)
    flag = ""
    for row in result.output.split("Options:")[1].splitlines():
        if row.strip().startswith("-"):
            flag = row.split()[0].rstrip(",")
            lines[flag] = row
        elif flag:
            lines[flag] += row
    for f in dataclasses.fields(MountConfig):
        spec = cli_of(f)
        if spec.kind == "argument":
            assert f.name.upper() in result.output
            continue
        line = lines[spec.flags[0].split("/")[0]]
        assert " ".join(spec.help.split()) in line, f.name
        if spec.show_default:
            assert f"[default: {shown_default(f)}]" in line, line


# The mount command with run_mount replaced: prints the MountConfig it was given.
_PRINT_CONFIG = """
import dataclasses, json, sys
from burstctl.fuse_shim import mount

def run_mount(config):
    print(json.dumps(dataclasses.asdict(config), default=str))
    return 0

mount.run_mount = run_mount
from burstctl.cli import main
sys.argv[0] = "burstctl"
main()
"""


def run_mount_command(
    *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    clean = clean_env()
    return subprocess.run(
        [sys.executable, "-c", _PRINT_CONFIG, "mount", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**clean, **(env or {})},
        check=False,
    )


def as_json(config: MountConfig) -> dict[str, Any]:
    return json.loads(json.dumps(dataclasses.asdict(config), default=str))


def test_the_command_line_builds_the_config(tmp_path: Path) -> None:
    b, m = tmp_path / "b", tmp_path / "m"
    plain = run_mount_command(str(b), str(m))
    assert plain.returncode == 0, plain.stderr
    assert json.loads(plain.stdout) == as_json(MountConfig(b, m))
    for cache in ("attr_timeout", "entry_timeout", "negative_timeout"):
        assert json.loads(plain.stdout)[cache] == 1.0  # the documented default

    given = run_mount_command(
        str(b),
        str(m),
        "--quiet-gap",
        "0.5",
        "--read-ahead",
        "2MiB",
        "--max-write",
        "64KiB",
        "--direct-io",
        "all",
        "--no-big-writes",
        "-f",
        "-o",
        "ro",
        "-o",
        "max_read=65536",
        "--attr-timeout",
        "0",
        "--entry-timeout",
        "2.5",
        "--negative-timeout",
        "0.5",
        "--max-handles",
        "5000",
        "--log-level",
        "debug",
        env={"BURSTCTL_CONTROLLER": "127.0.0.1:1"},
    )
    assert given.returncode == 0, given.stderr
    assert json.loads(given.stdout) == as_json(
        MountConfig(
            b,
            m,
            controller="127.0.0.1:1",
            quiet_gap=0.5,
            read_ahead=2 << 20,
            max_write=64 << 10,
            direct_io="all",
            big_writes=False,
            foreground=True,
            fuse_options=("ro", "max_read=65536"),
            attr_timeout=0.0,
            entry_timeout=2.5,
            negative_timeout=0.5,
            max_handles=5000,
            log_level="DEBUG",
        )
    )


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--quiet-gap", "-1"), "--quiet-gap must be a finite number of seconds >= 0"),
        (("--session-idle", "nan"), "--session-idle must be a finite number of seconds"),
        (("--read-ahead", "1000"), "--read-ahead must be a multiple of 4KiB"),
        (("--metadata-cost", "lots"), "not a size"),
        (("--fallback", "sometimes"), "invalid fallback 'sometimes'"),
        (("--fallback", "keep-last:0"), "invalid fallback 'keep-last:0'"),
        (("-o", "ro,writeback_cache"), "-o writeback_cache is not allowed"),
        (("-o", "entry_timeout=5"), "path-based API, which the mount does not use; use --entry"),
        (("--attr-timeout", "-1"), "--attr-timeout must be a finite number of seconds >= 0"),
        (("--negative-timeout", "inf"), "--negative-timeout must be a finite number of seconds"),
        (("--max-handles", "15"), "--max-handles must be >= 16, got 15"),
    ],
)
def test_bad_values_are_refused_before_mounting(
    tmp_path: Path, args: tuple[str, ...], says: str
) -> None:
    result = run_mount_command(str(tmp_path), str(tmp_path), *args)
    assert result.returncode != 0 and says in result.stderr, result.stderr
    assert result.stdout == ""  # run_mount was never reached


def test_the_config_checks_its_values_itself(tmp_path: Path) -> None:
    for bad in (
        {"attach_timeout": -0.1},
        {"fallback_grace": float("nan")},
        {"attribution_ttl": float("inf")},
        {"direct_io": "sometimes"},
        {"libfuse": "4"},
        {"max_write": 0},
        {"metadata_cost": -5},
        {"log_level": "LOUD"},
    ):
        with pytest.raises(MountError, match="--" + next(iter(bad)).replace("_", "-")):
            MountConfig(tmp_path, tmp_path, **bad)
    assert MountConfig(tmp_path, tmp_path).direct_io in DIRECT_IO_MODES


def test_the_fallback_grace_reaches_the_job_sessions(tmp_path: Path) -> None:
    from burstctl.client import ClientRuntime, JobInfo
    from burstctl.node.sessions import client_session_factory

    config = MountConfig(
        tmp_path,
        tmp_path,
        controller="127.0.0.1:1",
        fallback="keep-last:2MiB/s",
        fallback_grace=7.5,
    )
    with ClientRuntime() as runtime:
        session = client_session_factory(config, runtime)(JobInfo("j", "u", "g"))
        try:
            options = session._core.options  # type: ignore[attr-defined]
            assert options.fallback_grace == 7.5
            assert options.fallback.share_cap == 2 * (1 << 20)
        finally:
            session.close()
