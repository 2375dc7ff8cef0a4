"""The committed generated protobuf code matches what ``make proto`` produces now."""

from __future__ import annotations

from pathlib import Path

from burstctl.proto import generate


def test_generated_code_is_fresh(tmp_path: Path) -> None:
    fresh = generate.generate(tmp_path)
    assert fresh, "no .proto files found"
    committed_dir = generate.PROTO_ROOT / "burstctl" / "v1"
    for path in fresh:
        committed = committed_dir / path.name
        assert committed.exists(), f"{path.name} is not committed: run `make proto`"
        assert committed.read_text() == path.read_text(), (
            f"{committed} is stale: the .proto changed; run `make proto` and commit"
        )
    stray = {p.name for p in committed_dir.glob("*_pb2*.py*")} - {p.name for p in fresh}
    assert not stray, f"generated files without a .proto: {sorted(stray)}"


def test_staleness_is_detected(tmp_path: Path) -> None:
    """The check above can fail: edit a copy of the .proto and compare against the original."""
    root = tmp_path / "src"
    (root / "burstctl" / "v1").mkdir(parents=True)
    for proto in generate.proto_files():
        text = proto.read_text().replace(
            "message Goodbye {}", "message Goodbye { string why = 1; }"
        )
        (root / "burstctl" / "v1" / proto.name).write_text(text)
    edited = {p.name: p.read_text() for p in generate.generate(tmp_path / "out", root=root)}
    committed = generate.PROTO_ROOT / "burstctl" / "v1" / "controller_pb2.py"
    assert edited["controller_pb2.py"] != committed.read_text()


def test_generated_imports_are_relative() -> None:
    grpc_module = (generate.PROTO_ROOT / "burstctl" / "v1" / "controller_pb2_grpc.py").read_text()
    assert "from . import controller_pb2" in grpc_module
    assert "from burstctl.v1" not in grpc_module
    from burstctl.proto.burstctl.v1 import controller_pb2_grpc  # the rewritten import resolves

    assert controller_pb2_grpc.ControllerStub
