"""``burstctl exec``: the environment a command runs under the preload shim with.

`preload_env` asks the agent for its paths (``PATHS``), then prepends the library to
``LD_PRELOAD`` and sets ``BURSTCTL_AGENT_SOCKET`` and ``BURSTCTL_PRELOAD_PATHS`` (and
``BURSTCTL_JOB_ID`` for ``--job``). Nothing here may keep the command from running: an agent
that does not answer, or a library that is missing, is one warning on stderr and the command
runs unpaced (docs/preload.md, "burstctl exec and Slurm").
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from burstctl.preload_shim import library, server
from burstctl.preload_shim.config import DEFAULT_SOCKET, PATHS_VAR, SOCKET_VAR

WARNING_PREFIX = "burstctl-preload: "
# How long `burstctl exec` waits for the agent's answer (as the library does).
ANSWER_TIMEOUT = 5.0


def agent_paths(socket_path: str, timeout: float = ANSWER_TIMEOUT) -> list[str]:
    """The agent's burst-buffer paths (OSError or ValueError when it does not answer so)."""
    answer = server.request(socket_path, b"PATHS", timeout).decode()
    word, _, rest = answer.partition(" ")
    if word != "PATHS":
        raise ValueError(f"unexpected answer {answer[:80]!r}")
    return [p for p in rest.strip().split(":") if p]


def preload_env(
    environ: Mapping[str, str],
    agent_socket: str | None,
    job: str | None,
    warn: Callable[[str], None],
) -> tuple[dict[str, str], bool]:
    """``environ`` as a command runs under the shim with, and whether it is paced (False: the
    agent or the library is missing); ``warn`` gets the one warning."""
    env = dict(environ)
    if job:
        env["BURSTCTL_JOB_ID"] = job
    socket_path = agent_socket or environ.get(SOCKET_VAR) or DEFAULT_SOCKET
    try:
        lib = str(library.library_path())
        paths = agent_paths(socket_path)
    except (OSError, ValueError) as err:
        warn(f"{WARNING_PREFIX}{err}; running unpaced")
        return env, False
    if not paths:
        warn(f"{WARNING_PREFIX}the agent at {socket_path} paces no paths; running unpaced")
        return env, False
    preloaded = [p for p in env.get("LD_PRELOAD", "").replace(" ", ":").split(":") if p]
    env["LD_PRELOAD"] = ":".join([lib, *(p for p in preloaded if p != lib)])
    env[SOCKET_VAR] = os.path.abspath(socket_path)
    env[PATHS_VAR] = ":".join(paths)
    return env, True


def export_lines(env: Mapping[str, str], paced: bool, job: str | None) -> list[str]:
    """``export NAME=value`` lines of the shim's variables in ``env`` (a Slurm task prolog):
    none when not ``paced``; ``BURSTCTL_JOB_ID`` when a ``job`` was given."""
    names = ["LD_PRELOAD", SOCKET_VAR, PATHS_VAR] if paced else []
    if job:
        names.append("BURSTCTL_JOB_ID")
    return [f"export {name}={env[name]}" for name in names]
