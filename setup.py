"""Builds the LD_PRELOAD library (preload_shim/*.c, its parts, and their private header
preload_shim/preload.h) with the system's C compiler.

Everything else about the package is in pyproject.toml. The library is a plain shared object,
not a Python extension (it carries setuptools' extension suffix, but nobody imports it):
``burstctl.preload_shim.library.library_path()`` finds it, ``burstctl exec`` preloads it. It
links only libc (libdl, libpthread), never libpython.
"""

from __future__ import annotations

from glob import glob

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class BuildPreload(build_ext):
    """Builds the library as setuptools builds an extension, without a module init function."""

    def get_export_symbols(self, ext: Extension) -> list[str]:
        return []  # no PyInit_ function: it is not a module


setup(
    ext_modules=[
        Extension(
            "burstctl.preload_shim._preload",
            sources=sorted(glob("preload_shim/*.c")),
            depends=sorted(glob("preload_shim/*.h")),  # a changed header rebuilds every part
            extra_compile_args=["-std=gnu11", "-O2", "-fPIC", "-fvisibility=hidden"],
            libraries=["dl", "pthread"],
        )
    ],
    cmdclass={"build_ext": BuildPreload},
)
