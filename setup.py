"""Builds the package's two native parts with the system's C compiler.

- The LD_PRELOAD library (preload_shim/*.c, its parts, and their private header
  preload_shim/preload.h). It is a plain shared object, not a Python extension (it carries
  setuptools' extension suffix, but nobody imports it):
  ``burstctl.preload_shim.library.library_path()`` finds it, ``burstctl exec`` preloads it. It
  links only libc (libdl, libpthread), never libpython.
- The simulator's hot path, compiled with mypyc: the modules of ``[tool.burstctl] compiled``
  in pyproject.toml (the event loop, the decision path and the sharing functions). The same
  sources run interpreted, bit for bit the same, where they are not compiled: with
  ``BURSTCTL_PURE_PYTHON=1`` set at install time, or when mypyc cannot be imported (a
  warning says so). docs/simulator.md: "Compiled modules".

Everything else about the package is in pyproject.toml.
"""

from __future__ import annotations

import os
import runpy
import shutil
import sys
import sysconfig
from glob import glob
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


class BuildNative(build_ext):
    """Builds the preload library as setuptools builds an extension, without a module init
    function; the compiled modules as mypyc made them."""

    def get_export_symbols(self, ext: Extension) -> list[str]:
        if ext.name == PRELOAD:
            return []  # no PyInit_ function: it is not a module
        return super().get_export_symbols(ext)


PRELOAD = "burstctl.preload_shim._preload"


def preload_library() -> Extension:
    return Extension(
        PRELOAD,
        sources=sorted(glob("preload_shim/*.c")),
        depends=sorted(glob("preload_shim/*.h")),  # a changed header rebuilds every part
        extra_compile_args=["-std=gnu11", "-O2", "-fPIC", "-fvisibility=hidden"],
        libraries=["dl", "pthread"],
    )


def _interpreted(why: str) -> list[Extension]:
    print(
        f"warning: {why}: the simulator's hot path stays interpreted"
        " (the same results, about half the speed)",
        file=sys.stderr,
    )
    return []


def compiled_modules() -> list[Extension]:
    """mypyc's extensions for the modules of ``[tool.burstctl] compiled``, or none."""
    if os.environ.get("BURSTCTL_PURE_PYTHON"):
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        return _interpreted("mypyc is not installed")
    if not Path(sysconfig.get_paths()["include"], "Python.h").exists():
        return _interpreted("Python's C headers are not installed (python3-dev)")
    # package_layout.py, beside this file, run from its path: not installed yet
    layout = runpy.run_path(str(ROOT / "package_layout.py"))
    # mypy names a module by the packages above its file, so it reads the sources from a
    # tree of links laid out as installed (burstctl/<part>/...), not from the folders.
    tree = ROOT / "build" / "mypyc-src"
    shutil.rmtree(tree, ignore_errors=True)
    layout["link_tree"](tree)
    paths = [
        str(tree.joinpath(*module.split(".")).with_suffix(".py"))
        for module in layout["compiled_modules"]()
    ]
    # one shared library for the compiled code, inside the package (an editable install
    # finds nothing at the top level)
    return mypycify(paths, group_name="burstctl.compiled", target_dir=str(ROOT / "build" / "mypyc"))


setup(
    ext_modules=[preload_library(), *compiled_modules()],
    cmdclass={"build_ext": BuildNative},
)
