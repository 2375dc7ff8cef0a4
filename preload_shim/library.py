"""Where the preload library is: `library_path` (``burstctl preload-path`` prints it)."""

from __future__ import annotations

from pathlib import Path


def library_path() -> Path:
    """The built preload library, ``_preload*.so`` in this package; FileNotFoundError with
    what to do when it was not built."""
    here = Path(__file__).resolve().parent
    found = sorted(here.glob("_preload*.so"))
    if not found:
        raise FileNotFoundError(
            f"the preload library (_preload*.so) is not in {here}: reinstall burstctl with a C"
            " compiler available (pip install .), which builds it"
        )
    return found[0]
