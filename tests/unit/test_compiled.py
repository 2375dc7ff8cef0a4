"""The compiled hot path (setup.py, ``[tool.burstctl] compiled``): an install compiles it,
and compiled or interpreted, the simulator gives the same bits for every registered policy.

``tests/conftest.py`` stops the session before this when a compiled module is older than
its source (a stale build would test the code as it was).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from layering import compiled_modules, source_of

from burstctl.policies.registry import default_registry
from burstctl.simulator.bws.generate import GeneratorParams, generate
from burstctl.simulator.bws.instance import prepare_window
from burstctl.simulator.bws.runs import simulate

PURE = bool(os.environ.get("BURSTCTL_PURE_PYTHON"))
_HERE = Path(__file__).resolve().parent
_TEST_PATHS = [str(_HERE), str(_HERE.parent)]  # this module, and tests/ (layering)

# Loads the compiled modules from their sources (argv[1]: their folders; argv[2]: the
# modules; argv[3:]: the folders of this test and of its imports), then prints
# every_policy_metrics() and where each module was loaded from.
_RUN = r"""
import importlib, importlib.machinery as machinery, json, os, sys
folders = set(json.loads(sys.argv[1]))
sources = machinery.FileFinder.path_hook((machinery.SourceFileLoader, machinery.SOURCE_SUFFIXES))
def hook(path):
    if os.path.realpath(path) in folders:
        return sources(path)  # the compiled modules' folders: sources only
    raise ImportError(path)
sys.path_hooks.insert(0, hook)
sys.path_importer_cache.clear()
sys.path[:0] = sys.argv[3:]
from test_compiled import every_policy_metrics
loaded = {m: importlib.import_module(m).__file__ for m in json.loads(sys.argv[2])}
print(json.dumps({"loaded": loaded, "results": every_policy_metrics()}))
"""


def every_policy_metrics() -> dict[str, list[object]]:
    """Every registered policy on one small window, v1 and v2: the metrics as ``repr``
    strings (every bit) and the event count."""
    window = prepare_window(generate(GeneratorParams(pressure=1.1, horizon=1e5), 3))
    results: dict[str, list[object]] = {}
    for name in default_registry().names():
        for windows in ("v1", "v2"):
            r = simulate(window, name, windows=windows)
            results[f"{name} {windows}"] = [
                repr(r.min_yield),
                repr(r.efficiency),
                repr(r.utilization),
                repr(r.utilization_reference),
                r.events,
            ]
    return results


def _run_from_sources() -> dict[str, dict[str, object]]:
    modules = compiled_modules()
    folders = sorted({os.path.realpath(source_of(m).parent) for m in modules})
    out = subprocess.run(
        [sys.executable, "-c", _RUN, json.dumps(folders), json.dumps(modules), *_TEST_PATHS],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    result: dict[str, dict[str, object]] = json.loads(out.stdout)
    return result


def _is_extension(path: str) -> bool:
    return path.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))


@pytest.mark.skipif(PURE, reason="BURSTCTL_PURE_PYTHON: installed without compiling")
def test_an_install_compiles_the_listed_modules_and_the_simulator_loads_them() -> None:
    modules = compiled_modules()
    assert "burstctl.simulator.bws.fluid" in modules
    for module in modules:
        spec = importlib.util.find_spec(module)
        assert spec is not None and spec.origin is not None
        assert _is_extension(spec.origin), (
            f"{module} is loaded from {spec.origin}: the install did not compile it"
            " (is mypyc in the build environment? setup.py warns when it is not)"
        )


def test_compiled_and_interpreted_give_the_same_bits_for_every_policy() -> None:
    """A child interpreter loads the listed modules from their sources; this one as
    installed (compiled, unless BURSTCTL_PURE_PYTHON). Same window, same bits."""
    pure = _run_from_sources()
    for module, path in pure["loaded"].items():
        assert str(path).endswith(".py"), f"{module} was not loaded from its source: {path}"
    assert pure["results"] == every_policy_metrics()
