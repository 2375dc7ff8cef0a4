"""Where the built LD_PRELOAD library is (``preload_shim/*.c``, compiled by the package's
own build: ``setup.py``)."""

from __future__ import annotations

from pathlib import Path

_HERE = Path(__file__).resolve().parent


class LibraryMissing(FileNotFoundError):
    """The preload library was not built (no C compiler when the package was installed).

    A `FileNotFoundError`, so that callers that run unpaced on any `OSError` catch it too."""


def library_path() -> Path:
    """The built library (``_preload*.so`` next to this module), for ``LD_PRELOAD``.

    Raises `LibraryMissing` naming the fix when the package was installed without building it.
    """
    found = sorted(_HERE.glob("_preload*.so"))
    if not found:
        raise LibraryMissing(
            f"the burstctl preload library is not built (no _preload*.so in {_HERE}): install a C "
            "compiler and the libc headers (Debian: apt-get install gcc libc6-dev, or "
            "deploy/system-deps.sh), then reinstall the package (pip install -e . or make)"
        )
    # Several only after a Python upgrade in place: the newest build wins.
    return max(found, key=lambda p: p.stat().st_mtime)
