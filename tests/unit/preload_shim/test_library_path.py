"""`library_path()`: the built preload library, or an error that names the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from burstctl.preload_shim import library


def test_a_missing_library_names_the_fix(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(library, "_HERE", tmp_path)
    with pytest.raises(library.LibraryMissing) as err:
        library.library_path()
    assert isinstance(err.value, OSError)  # what `burstctl exec` catches to run unpaced
    message = str(err.value)
    assert str(tmp_path) in message
    assert "gcc" in message and "libc6-dev" in message and "pip install" in message


def test_the_built_library_is_found(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(library, "_HERE", tmp_path)
    built = tmp_path / "_preload.cpython-311-x86_64-linux-gnu.so"
    built.write_bytes(b"\x7fELF")
    (tmp_path / "preload.c").write_text("/* not the library */")
    assert library.library_path() == built
