"""Imports go one way: no cycle inside the mount, the shims' shared part or the client.

Read from the source (every import statement, the lazy ones inside functions too), so a cycle
that only closes at run time is found as well. Which package may import which is checked by
the import-linter contracts of pyproject.toml (tests/unit/test_layering.py).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = {
    "burstctl.client": ROOT / "client",
    "burstctl.node": ROOT / "node",
    "burstctl.fuse_shim": ROOT / "fuse_shim",
}


def modules() -> dict[str, Path]:
    found = {}
    for package, folder in PACKAGES.items():
        for path in sorted(folder.glob("*.py")):
            name = package if path.stem == "__init__" else f"{package}.{path.stem}"
            found[name] = path
    return found


def imports_of(path: Path, known: set[str]) -> set[str]:
    """The burstctl modules ``path`` imports, anywhere in it (``from p import m`` counts m)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {n for n in names if n.startswith("burstctl.") and (n in known or "." in n)}


def graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    return {name: imports_of(path, known) for name, path in found.items()}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """A cycle among the modules of ``edges`` (as a path that ends where it starts), or None."""
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(edges.get(node, set()) & edges.keys()):
            if state.get(nxt) == "open":
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(edges):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_mount_and_the_client_have_no_import_cycle() -> None:
    edges = graph()
    assert "burstctl.fuse_shim.fs" in edges and "burstctl.client.core" in edges
    # Package __init__ modules are left out: importing a submodule runs them anyway, and
    # ``burstctl.client`` re-exports the public API.
    inner = {n: e - set(PACKAGES) for n, e in edges.items() if n not in PACKAGES}
    assert find_cycle(inner) is None, " -> ".join(find_cycle(inner) or [])
    assert "burstctl.fuse_shim.mount" not in edges["burstctl.fuse_shim.fs"]


def test_the_cycle_check_finds_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_neither_shim_imports_the_other() -> None:
    # What they share is burstctl.node (also the layers contract: fuse_shim | preload_shim).
    for folder, other in (
        ("preload_shim", "burstctl.fuse_shim"),
        ("fuse_shim", "burstctl.preload_shim"),
    ):
        for path in sorted((ROOT / folder).rglob("*.py")):
            found = [n for n in imports_of(path, set()) if n.startswith(other)]
            assert not found, f"{folder}/{path.name} imports {found}"
