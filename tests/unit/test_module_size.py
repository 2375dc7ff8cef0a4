"""No room too big: every product source module (Python and C) is at most 600 lines.

A module past that mixes parts that deserve their own name and docstring; split it
where its parts meet rather than raising the bound. Generated code (the protobuf
modules) is not written by hand and is left out.
"""

from __future__ import annotations

from pathlib import Path

from layering import ROOT, package_dirs

MAX_LINES = 600


def product_sources(root: Path) -> list[Path]:
    """The Python and C sources of the installed packages (pyproject's package folders)."""
    folders = set(package_dirs(root).values())
    return sorted(
        path
        for folder in folders
        for pattern in ("*.py", "*.c", "*.h")
        for path in (root / folder).rglob(pattern)
        if not path.name.endswith(("_pb2.py", "_pb2_grpc.py", "_pb2.pyi"))
        and "__pycache__" not in path.parts
    )


def too_long(paths: list[Path], root: Path) -> dict[str, int]:
    """The modules of ``paths`` over the bound, by path under ``root``, with their length."""
    lengths = {str(p.relative_to(root)): len(p.read_bytes().splitlines()) for p in paths}
    return {name: n for name, n in lengths.items() if n > MAX_LINES}


def test_no_product_module_is_longer_than_600_lines() -> None:
    sources = product_sources(ROOT)
    names = {p.name for p in sources}
    assert {"fluid.py", "jobs.py", "io.c", "preload.h"} <= names  # it sees every package
    assert too_long(sources, ROOT) == {}


def test_a_long_module_is_seen(tmp_path: Path) -> None:
    (tmp_path / "short.py").write_text("x = 1\n" * MAX_LINES)
    (tmp_path / "long.c").write_text("int x;\n" * (MAX_LINES + 1))
    assert too_long(sorted(tmp_path.iterdir()), tmp_path) == {"long.c": MAX_LINES + 1}
