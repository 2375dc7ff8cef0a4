"""The options both shims share and the command lines generated from a configuration class."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

import click
import pytest
from click.testing import CliRunner

from burstctl.fuse_shim.config import MountConfig, MountError
from burstctl.node.options import Cli, check_values, cli_of, config_params, format_size
from burstctl.preload_shim.config import AgentConfig


def test_the_options_are_generated_from_the_config_class_they_are_given() -> None:
    @dataclass(frozen=True)
    class Other:
        gap: float = field(
            default=0.25,
            metadata={"cli": Cli(("--gap",), "A gap.", kind="seconds", metavar="S")},
        )
        mode: str = field(
            default="b",
            metadata={"cli": Cli(("--mode",), "A mode.", kind="choice", choices=("a", "b"))},
        )
        size: int = field(
            default=3 << 20, metadata={"cli": Cli(("--size",), "A size.", kind="size")}
        )

    @click.command()
    def show(**values: Any) -> None:
        click.echo(json.dumps(values))

    show.params = config_params(Other)
    runner = CliRunner()
    assert json.loads(runner.invoke(show, []).output) == {
        "gap": 0.25,
        "mode": "b",
        "size": 3 << 20,
    }
    help_text = runner.invoke(show, ["--help"]).output
    assert "A gap.  [default: 0.25]" in help_text and "[default: 3MiB]" in help_text
    assert json.loads(runner.invoke(show, ["--size", "1KiB", "--mode", "A"]).output)["size"] == 1024


def test_format_size_is_exact() -> None:
    assert [format_size(n) for n in (0, 1000, 4096, 1 << 20, 3 << 30, (1 << 20) + 1024)] == [
        "0",
        "1000",
        "4KiB",
        "1MiB",
        "3GiB",
        "1025KiB",
    ]


def test_both_shims_spell_the_shared_options_alike() -> None:
    agent = {f.name: f for f in dataclasses.fields(AgentConfig)}
    for f in dataclasses.fields(MountConfig):
        if f.name not in agent:
            continue
        ours, theirs = cli_of(f), cli_of(agent[f.name])
        if f.name in ("controller", "stage_out"):  # required / what it drains: own help
            ours, theirs = dataclasses.replace(ours, help=""), dataclasses.replace(theirs, help="")
        assert ours == theirs, f.name
        assert f.default == agent[f.name].default, f.name


def test_the_checks_name_the_flag_and_let_an_unset_choice_be() -> None:
    @dataclass(frozen=True)
    class Checked:
        mode: str | None = field(
            default=None,
            metadata={"cli": Cli(("--mode",), "A mode.", kind="choice", choices=("a", "b"))},
        )
        level: str = field(
            default="a",
            metadata={"cli": Cli(("--level",), "A level.", kind="choice", choices=("a", "b"))},
        )

    check_values(Checked(), MountError)
    with pytest.raises(MountError, match="--mode must be one of a, b, got 'c'"):
        check_values(Checked(mode="c"), MountError)
    with pytest.raises(MountError, match="--level must be one of a, b, got None"):
        check_values(Checked(level=None), MountError)  # type: ignore[arg-type]
