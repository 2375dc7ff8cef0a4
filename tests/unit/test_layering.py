"""The layering contracts of pyproject.toml hold, and the check can see a broken one."""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

from layering import ROOT, check, link_tree, package_dirs


def test_the_import_contracts_hold(tmp_path: Path) -> None:
    result = check(link_tree(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    count = len(contracts["contracts"])
    assert f"{count} kept, 0 broken" in result.stdout
    assert any(c["type"] == "layers" for c in contracts["contracts"])


def test_a_forbidden_import_breaks_a_contract(tmp_path: Path) -> None:
    # a copy of the repository's policies with one module importing the controller
    copy = tmp_path / "repo"
    copy.mkdir()
    shutil.copy(ROOT / "pyproject.toml", copy)
    for folder in set(package_dirs().values()) - {"policies"}:
        (copy / folder).symlink_to(ROOT / folder, target_is_directory=True)
    shutil.copytree(ROOT / "policies", copy / "policies", ignore=shutil.ignore_patterns("__py*"))
    fcfs = copy / "policies" / "fcfs.py"
    fcfs.write_text(fcfs.read_text() + "\nfrom burstctl.controller import jobs  # noqa\n")
    result = check(link_tree(tmp_path / "tree", copy), copy / "pyproject.toml")
    assert result.returncode != 0
    assert "BROKEN" in result.stdout and "burstctl.policies.fcfs" in result.stdout


def test_the_layers_contract_names_every_package() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = {name.removeprefix("burstctl.") for name in package_dirs() if name != "burstctl"}
    (layers,) = [c for c in config["tool"]["importlinter"]["contracts"] if c["type"] == "layers"]
    named = {part.strip() for layer in layers["layers"] for part in layer.split("|")}
    assert named == packages
