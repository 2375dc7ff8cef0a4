"""Checks the import contracts of pyproject.toml (``[tool.importlinter]``) with import-linter.

``make lint`` runs this script and ``tests/unit/test_layering.py`` runs it in CI.
The package maps ``burstctl.<part>`` to top-level folders (``[tool.setuptools.package-dir]``),
which import-linter's graph builder cannot walk from the editable install. So this
builds the installed layout as a tree of symbolic links in a temporary directory and
runs ``lint-imports`` in a child interpreter that sees that tree and not the editable
install (``-S``: no ``.pth`` files; the site-packages directories come after the tree).

    python tests/layering.py
"""

from __future__ import annotations

import os
import runpy
import site
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


# package_layout.py, beside setup.py, run from its path: the repository root on ``sys.path``
# would shadow the installed ``burstctl`` with its ``burstctl/`` folder.
_layout = runpy.run_path(str(ROOT / "package_layout.py"))
link_tree = _layout["link_tree"]
package_dirs = _layout["package_dirs"]
compiled_modules = _layout["compiled_modules"]
source_of = _layout["source_of"]

__all__ = [
    "ROOT",
    "check",
    "compiled_modules",
    "link_tree",
    "main",
    "package_dirs",
    "source_of",
]

_RUN = """
import sys
from importlinter.cli import lint_imports_command
sys.argv = ["lint-imports", sys.argv[1]]
lint_imports_command()
"""


def check(tree: Path, config: Path = ROOT / "pyproject.toml") -> subprocess.CompletedProcess[str]:
    """``lint-imports`` on the package in ``tree``, with the contracts of ``config``."""
    paths = [str(tree), *site.getsitepackages()]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    return subprocess.run(
        [sys.executable, "-S", "-c", _RUN, str(config)],
        cwd=tree,  # not the repository: its folders must not shadow the tree
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="burstctl-layering-") as tmp:
        result = check(link_tree(Path(tmp)))
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    return result.returncode


if __name__ == "__main__":
    raise SystemExit(main())
