"""Regenerates the Python code of the wire protocol from ``proto/burstctl/v1/*.proto``.

Run as ``make proto`` (or ``python -m burstctl.proto.generate``). The generated
``*_pb2.py``, ``*_pb2.pyi`` and ``*_pb2_grpc.py`` are committed next to the
``.proto`` files; ``tests/unit/test_proto_fresh.py`` regenerates into a
temporary directory and fails when the committed code differs.

protoc writes absolute imports (``from burstctl.v1 import x_pb2``) that only work
when ``proto/`` is on ``sys.path``; the package is installed as
``burstctl.proto``, so the imports between generated modules are rewritten to
relative ones.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

PROTO_ROOT = Path(__file__).resolve().parent
_ABS_IMPORT = re.compile(r"^from burstctl\.v1 import (\w+_pb2)", re.MULTILINE)


def proto_files(root: Path = PROTO_ROOT) -> list[Path]:
    return sorted((root / "burstctl" / "v1").glob("*.proto"))


def generate(out_dir: Path, root: Path = PROTO_ROOT) -> list[Path]:
    """Writes generated modules for every .proto under ``root`` into ``out_dir``."""
    import grpc_tools
    from grpc_tools import protoc  # dev/test dependency only

    include = Path(grpc_tools.__file__).resolve().parent / "_proto"
    sources = [str(p.relative_to(root)) for p in proto_files(root)]
    out_dir.mkdir(parents=True, exist_ok=True)
    args = [
        "grpc_tools.protoc",
        f"-I{root}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *sources,
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed: {' '.join(args)}")
    written = sorted((out_dir / "burstctl" / "v1").glob("*_pb2*.py*"))
    for path in written:
        text = _ABS_IMPORT.sub(r"from . import \1", path.read_text())
        path.write_text(text)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=PROTO_ROOT, help="output root (default: proto/)"
    )
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
