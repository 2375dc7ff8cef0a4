"""The ``burstctl`` command line: one group, a subcommand per tool, above every other part.

Each family of commands is a module of its own (``daemon``, ``shims``, ``admin``, and the
``sim`` group with one module per research family), imported only when one of its commands
runs or is asked for help, so that ``burstctl --help`` stays fast and a missing optional
dependency of one tool does not break the others. The commands import what they run
inside their bodies, for the same reason.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping

import click

from burstctl import __version__


class LazyGroup(click.Group):
    """A group whose subcommands are ``module:attribute`` names, imported when first needed."""

    def __init__(self, *args: object, lazy: Mapping[str, str], **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.lazy = dict(lazy)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = self.lazy.get(cmd_name)
        if target is None:
            return super().get_command(ctx, cmd_name)
        module, _, name = target.partition(":")
        command = getattr(importlib.import_module(module), name)
        assert isinstance(command, click.Command), target
        return command


@click.group(
    cls=LazyGroup,
    lazy={
        "controller": "burstctl.cli.daemon:controller",
        "mount": "burstctl.cli.shims:mount",
        "umount": "burstctl.cli.shims:umount",
        "agent": "burstctl.cli.shims:agent",
        "exec": "burstctl.cli.shims:exec_",
        "preload-path": "burstctl.cli.shims:preload_path",
        "policies": "burstctl.cli.admin:list_policies",
        "policy": "burstctl.cli.admin:policy",
        "jobs": "burstctl.cli.admin:jobs",
        "job": "burstctl.cli.admin:job",
        "top": "burstctl.cli.admin:top",
        "placement": "burstctl.cli.admin:placement",
        "rules": "burstctl.cli.rules:rules",
        "sim": "burstctl.cli.sim:sim",
    },
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.version_option(__version__, prog_name="burstctl")
def main() -> None:
    """Policy-driven I/O bandwidth sharing for HPC burst buffers."""


if __name__ == "__main__":
    sys.exit(main())
