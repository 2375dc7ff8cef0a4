"""Every repository path and module the documentation names exists.

Scanned: README.md and every docs/**/*.md. In each, the text in backticks (inline spans and
fenced blocks) and the targets of Markdown links. Checked:

- a path whose first part is a top-level entry of the repository (``controller/jobs.py``,
  ``simulator/bws/``, ``tests/support/views.py``, ``bench/sim_speed.py``, ``preload_shim/*.c``)
  exists, relative to the repository root (a glob matches at least one file);
- a partial path or a bare name of a source file (``_fuse/callbacks.py``, ``scheduler.py``)
  is the end of the path of some file of the repository; in a table row about a package (its
  first cell a path such as ``controller/rest/``), of a file of that package;
- a module name ``burstctl.<package>.<module>[.<name>]`` (or ``module:name``) is a module of
  the tree, and the name after it, if any, is defined in that module;
- a relative link target exists, relative to the page that links it.

Not checked, on purpose:

- docs/results/: the outputs of past runs, kept as those runs wrote them;
- the bodies of docs/benchmarks.md: each entry is the record of a measurement at its time and
  names the files of that time (its first section maps the old paths to the current ones).
  Its headings are checked: each names a bench script one runs today.

Placeholders (``DIR/readings.md``: a first part in capitals) and absolute and home paths
(the host's ``/etc/...``) are not paths of the tree. A name is read up to the first character
no path of the tree has (a space, ``…``, ``<``, ``{``), so ``tests/support/…`` checks
``tests/support/``.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# What is not part of the tree as committed, though it may sit in a checkout.
NOT_TREE = {".venv", "build", ".git", ".pytest_cache", ".ruff_cache", ".mypy_cache"}
# Source files whose bare or partial names are looked up anywhere in the tree.
SOURCE_SUFFIXES = (".py", ".pyi", ".c", ".h", ".proto", ".sh")
# Files the docs name that are not burstctl's: an external header, the authors' script, a
# user's program in an example, a script the reader writes.
NOT_OURS = {"fuse_lowlevel.h", "generate_sets.py", "train.py", "cluster.py"}
# Dotted names under ``burstctl.`` that are not modules: logger names, the proto package.
NOT_MODULES = {"burstctl.decisions", "burstctl.v1"}

_SPAN = re.compile(r"```.*?```|`[^`\n]+`", re.S)
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_TOKEN = re.compile(r"[\w./*@+:-]+")
_MODULE = re.compile(r"burstctl(?:\.\w+)+(?::\w+)?")


def in_tree(name: str) -> bool:
    """Whether a top-level entry is part of the tree (not a venv, a build, a cache)."""
    return name not in NOT_TREE and not name.endswith("-info")


def top_level(root: Path) -> set[str]:
    return {p.name for p in root.iterdir() if in_tree(p.name)}


def tree_files(root: Path) -> list[str]:
    """Every file of the tree, as a path relative to ``root``."""
    found: list[str] = []
    for folder, dirs, names in os.walk(root):
        here = Path(folder).relative_to(root)
        dirs[:] = [d for d in dirs if d != "__pycache__" and (here.parts or in_tree(d))]
        found += [(here / n).as_posix() for n in names]
    return found


def spans(text: str) -> Iterator[tuple[str, str | None]]:
    """The text of every backtick span and fenced block, with the package a table row is
    about (the first part of the path in its first cell, ``controller`` for a row that
    starts ``| `controller/rest/` |``; a top-level folder), or None outside such a row."""
    fenced = re.compile(r"^```.*?^```", re.S | re.M)
    for block in fenced.finditer(text):
        yield block.group(0).strip("`"), None
    for line in fenced.sub("", text).splitlines():
        row = re.match(r"\|\s*`([\w.-]+)/", line)
        for match in _SPAN.finditer(line):
            yield match.group(0).strip("`"), row.group(1) if row else None


def path_names(text: str, tops: set[str]) -> Iterator[tuple[str, str | None]]:
    """The names in backticks that look like paths of the tree (see the module docstring),
    each with the package of the table row it is in (None: anywhere)."""
    for span, scope in spans(text):
        for token in _TOKEN.findall(span):
            # path:line, a pytest id path::test, a URL (no path of the tree has a colon)
            token = token.split(":")[0].rstrip(".,;").removeprefix("./")
            if ("/" not in token and not token.endswith(SOURCE_SUFFIXES)) or token in NOT_OURS:
                continue
            first = token.split("/")[0]
            # an absolute path, a placeholder (DIR/...), an extension alone (.proto), a URL
            if not first or first.isupper() or first.startswith(("..", "~")) or "//" in token:
                continue
            if token.startswith(".") and "/" not in token:
                continue
            if first in tops or token.endswith(SOURCE_SUFFIXES):
                yield token, scope if scope in tops else None


def module_names(text: str) -> Iterator[str]:
    """The ``burstctl.x.y`` names in backticks (not part of a longer dotted name)."""
    for span, _ in spans(text):
        for match in _MODULE.finditer(span):
            before = span[match.start() - 1] if match.start() else " "
            if before in "._/":  # user.burstctl.job: an xattr; grafana/burstctl.json: a path
                continue
            yield match.group(0).rstrip(".")


def link_targets(text: str) -> Iterator[str]:
    """The relative targets of Markdown links, without their anchors."""
    for match in _LINK.finditer(text):
        target = match.group(1).split("#")[0]
        if target and not re.match(r"^[a-z]+:", target):
            yield target


def path_exists(
    name: str, root: Path, tops: set[str], files: list[str], scope: str | None = None
) -> bool:
    """Whether ``name`` is a path of the tree; a partial one is the end of a file's path,
    inside the package ``scope`` when the name is in a table row about that package."""
    first = name.split("/")[0]
    if first in tops:
        if any(c in name for c in "*?["):
            return any(root.glob(name))
        return (root / name).exists()
    patterns = [f"{scope}/{name}", f"{scope}/*/{name}"] if scope else [name, f"*/{name}"]
    return any(fnmatch.fnmatchcase(f, p) for f in files for p in patterns)


def module_file(parts: list[str], root: Path) -> Path | None:
    """The source of module ``burstctl.<parts>`` in the tree (each top-level folder is the
    package ``burstctl.<folder>``; the folder ``burstctl/`` holds the top package itself)."""
    if not parts:
        candidates = [root / "burstctl" / "__init__.py"]
    else:
        base = root.joinpath(*parts)
        candidates = [base / "__init__.py", base.with_suffix(".py")]
        if len(parts) == 1:
            candidates.append(root / "burstctl" / f"{parts[0]}.py")
    return next((c for c in candidates if c.is_file()), None)


def defines(source: str, name: str) -> bool:
    """Whether a module's source binds ``name``: a def, a class, an assignment, an import."""
    return bool(
        re.search(rf"^\s*(?:async def|def|class) {name}\b|^{name}\b[^=\n]*=", source, re.M)
        or re.search(rf"^(?:from|import) .*\b{name}\b", source, re.M)
    )


def module_exists(name: str, root: Path) -> bool:
    """``burstctl.a.b[.c]`` or ``burstctl.a.b:c``: a module of the tree, then a name in it."""
    if any(name == n or name.startswith(n + ".") for n in NOT_MODULES):
        return True
    dotted, _, attribute = name.partition(":")
    parts = dotted.split(".")[1:]
    for cut in range(len(parts), -1, -1):
        module = module_file(parts[:cut], root)
        if module is not None:
            after = parts[cut : cut + 1] or ([attribute] if attribute else [])
            return all(defines(module.read_text(), n) for n in after)
    return False


def scanned(root: Path) -> Iterator[tuple[Path, str]]:
    """Each page and the text of it that is checked."""
    pages = [root / "README.md", *sorted((root / "docs").rglob("*.md"))]
    for page in pages:
        rel = page.relative_to(root)
        if rel.parts[:2] == ("docs", "results"):
            continue
        text = page.read_text()
        if rel.as_posix() == "docs/benchmarks.md":
            text = "\n".join(line for line in text.splitlines() if line.startswith("#"))
        yield page, text


def missing(root: Path) -> list[str]:
    """``page: name`` for every name a page gives that the tree lacks."""
    tops, files = top_level(root), tree_files(root)
    wrong: list[str] = []
    for page, text in scanned(root):
        where = page.relative_to(root).as_posix()
        for name, scope in sorted(set(path_names(text, tops)), key=str):
            if not path_exists(name, root, tops, files, scope):
                wrong.append(f"{where}: {name}" + (f" (in {scope}/)" if scope else ""))
        for name in sorted(set(module_names(text))):
            if not module_exists(name, root):
                wrong.append(f"{where}: {name}")
        for target in sorted(set(link_targets(text))):
            if not (page.parent / target).exists():
                wrong.append(f"{where}: link {target}")
    return wrong


def test_every_path_the_docs_name_exists() -> None:
    wrong = missing(ROOT)
    assert not wrong, "the docs name what the tree lacks:\n" + "\n".join(wrong)


def test_the_extractor_sees_a_wrong_path(tmp_path: Path) -> None:
    """The check can fail: a page that names a module, a file, a partial path, a dotted
    module and a link that do not exist is caught on each, and its true names pass."""
    (tmp_path / "controller" / "rest").mkdir(parents=True)
    (tmp_path / "controller" / "__init__.py").write_text("")
    (tmp_path / "controller" / "jobs.py").write_text("class JobTable:\n    pass\n")
    (tmp_path / "controller" / "rest" / "policy.py").write_text("")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "results").mkdir()
    (tmp_path / "docs" / "results" / "old.md").write_text("`controller/gone.py`\n")
    (tmp_path / "docs" / "rest.md").write_text("")
    (tmp_path / "docs" / "benchmarks.md").write_text(
        "## `bench/gone.py` — a script\n\nRun at its time on `simulator/engine.py`.\n"
    )
    (tmp_path / "README.md").write_text(
        "The table is `controller/jobs.py: JobTable` (`burstctl.controller.jobs.JobTable`),\n"
        "the routes `rest/policy.py` and [the API](docs/rest.md#policy); `/etc/x.toml`,\n"
        "`DIR/readings.md`, `user.burstctl.job` and `400MiB/s` are no paths.\n"
        "Stale: `controller/sessions.py`, `_fuse/loop.py`, `burstctl.controller.rest_api`,\n"
        "`burstctl.controller.jobs.Table`, [gone](docs/gone.md) and\n"
        "```\npython bench/old.py --x\n```\n"
        "| `controller/` | `jobs.py`, `rest/policy.py`, `fluid.py` |\n"
        "| `rest/` | `fluid.py`: a row about no top-level folder |\n"
    )
    (tmp_path / "simulator").mkdir()
    (tmp_path / "simulator" / "fluid.py").write_text("")
    assert sorted(missing(tmp_path)) == [
        "README.md: _fuse/loop.py",
        "README.md: bench/old.py",
        "README.md: burstctl.controller.jobs.Table",
        "README.md: burstctl.controller.rest_api",
        "README.md: controller/sessions.py",
        "README.md: fluid.py (in controller/)",
        "README.md: link docs/gone.md",
        "docs/benchmarks.md: bench/gone.py",
    ]
