"""The installed layout of the package, for the tools that cannot read pyproject's
``[tool.setuptools.package-dir]`` (each top-level folder installed as ``burstctl.<part>``):
import-linter (``tests/layering.py``) and mypyc (``setup.py``) walk a tree of links laid
out as installed. Also the modules that ``setup.py`` compiles (``[tool.burstctl] compiled``).

Standard library only: ``setup.py`` imports it before anything is installed.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent


def _config(root: Path) -> dict:  # type: ignore[type-arg]
    return tomllib.loads((root / "pyproject.toml").read_text())


def package_dirs(root: Path = ROOT) -> dict[str, str]:
    """Each installed package (``burstctl.<part>``) and the folder under ``root`` it comes
    from: pyproject's ``[tool.setuptools.package-dir]``."""
    mapping: dict[str, str] = _config(root)["tool"]["setuptools"]["package-dir"]
    return mapping


def compiled_modules(root: Path = ROOT) -> list[str]:
    """The modules ``setup.py`` compiles with mypyc (``[tool.burstctl] compiled``)."""
    modules: list[str] = _config(root)["tool"]["burstctl"]["compiled"]
    return modules


def source_of(module: str, root: Path = ROOT) -> Path:
    """The source file of ``module`` (``burstctl.<part>.…``) under ``root``."""
    mapping = package_dirs(root)
    package = max((p for p in mapping if module.startswith(p + ".")), key=len)
    rest = module[len(package) + 1 :].split(".")
    return root.joinpath(mapping[package], *rest).with_suffix(".py")


def link_tree(dest: Path, root: Path = ROOT) -> Path:
    """``dest/burstctl`` laid out as installed, made of links into ``root``."""
    mapping = package_dirs(root)
    package = dest / "burstctl"
    package.mkdir(parents=True)
    for source in (root / mapping["burstctl"]).iterdir():
        if source.suffix in (".py", ".typed"):
            (package / source.name).symlink_to(source)
    for name, folder in mapping.items():
        if name != "burstctl":
            (dest / name.replace(".", "/")).symlink_to(root / folder, target_is_directory=True)
    return dest


if __name__ == "__main__":  # the Makefile: the compiled modules' sources, one per line
    print("\n".join(str(source_of(m).relative_to(ROOT)) for m in compiled_modules()))
