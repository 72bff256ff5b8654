"""The import rules of DESIGN.md, read from the source with ast, and incell/ on the standard library alone.

- no import circles among compatlab's modules (module-level imports, those under ``if TYPE_CHECKING:`` too:
  a circle that only type checking closes is still two modules that each need the other);
- no module imports another module's underscore names (a private module's public names are fine);
- config/ imports nothing above it; stages/ never imports cli/, runner or render/; render/ reads runs/ only;
  index/ never imports cli/, stages/, runner or render/;
- net (the one HTTP helper of every client: stages/, index/) imports nothing of compatlab but errors and urls;
- each module of the middle (the modules at compatlab's top: cells, envs, existing, proc, site, runner …) has a
  row of what it may import (``MIDDLE``), each below its users: a new one gets a row, and none imports upward;
- no source file is over ``MAX_LINES`` lines;
- runs/ imports nothing above it: only runs/, errors, urls (a standard-library leaf: the store redacts what
  it publishes itself) and the standard library;
- in render/, the formatters (html.py, markdown.py) read the view (view.py), the text helpers (text.py) and
  the page assets, never each other nor what the view is built from;
- incell/ imports only the standard library and itself (its pytest plugin and suites also pytest, which
  the lab adds to the cell), read from the source here and proven in tests/e2e/test_incell_imports.py by importing
  each module in a fresh interpreter that cannot import the lab's dependencies;
- no program held in a string and run with ``python -c``: what runs with a cell's interpreter is a module
  of incell/, run as one (``proc.incell_command``), so ruff, mypy and the rules above read it;
- what an axis kind means is said once, in config/axes.py's table: no other module spells the name,
  distribution or import name of a kind that is not required (sgl-kernel, flashinfer, sglang …), except
  incell/, which runs in the cell on the standard library alone and cannot read the table, and the stages
  that start SGLang's own server (serve, perf), which are about SGLang itself;
- outside incell/, distribution names are compared by packaging's ``canonicalize_name``: PEP 503 is not written
  again by hand.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TypeGuard

from compatlab.config.axes import AXIS_KINDS
from compatlab.render.formats import FORMATS

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = SRC / "compatlab"


def _name(path: Path, root: Path = SRC) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


MODULES = {_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _type_checking(node: ast.stmt) -> TypeGuard[ast.If]:
    """``if TYPE_CHECKING:`` or ``if typing.TYPE_CHECKING:``."""
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(
    path: Path, *, top_level_only: bool, root: Path = SRC, modules: Mapping[str, Path] = MODULES
) -> list[tuple[str, list[str], int]]:
    """(module, imported names, line) for each import; relative imports resolved.

    *top_level_only*: the module's own statements and those of its top-level ``if TYPE_CHECKING:`` blocks
    (what loading or type checking the module imports), not imports inside functions.
    """
    tree = ast.parse(path.read_text(encoding="utf-8"))
    me = _name(path, root)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    nodes: list[ast.AST]
    if top_level_only:
        nodes = [*tree.body, *(n for top in tree.body if _type_checking(top) for n in top.body)]
    else:
        nodes = list(ast.walk(tree))
    out: list[tuple[str, list[str], int]] = []
    for node in nodes:
        if isinstance(node, ast.Import):
            out.extend((alias.name, [], node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            names = [a.name for a in node.names]
            # `from compatlab.stages import install` imports a module, not a name
            submodules = [n for n in names if f"{base}.{n}" in modules]
            out.extend((f"{base}.{n}", [], node.lineno) for n in submodules)
            rest = [n for n in names if n not in submodules]
            if rest or not submodules:
                out.append((base, rest, node.lineno))
    return out


def _internal(module: str, modules: Mapping[str, Path] = MODULES) -> str | None:
    while module and module not in modules:
        module = module.rpartition(".")[0]
    return module or None


def _circles(modules: Mapping[str, Path], root: Path = SRC) -> list[list[str]]:
    graph = {
        m: sorted(
            {
                t
                for imp, _, _ in _imports(p, top_level_only=True, root=root, modules=modules)
                if (t := _internal(imp, modules)) and t != m
            }
        )
        for m, p in modules.items()
    }
    cycles: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for n in graph[m]:
            if state.get(n) == 1:
                cycles.append([*stack[stack.index(n) :], n])
            elif n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in graph:
        if m not in state:
            visit(m)
    return cycles


def test_no_import_circles() -> None:
    assert _circles(MODULES) == []


def test_no_module_imports_another_modules_underscore_names() -> None:
    bad: list[str] = []
    for m, p in MODULES.items():
        for imp, names, line in _imports(p, top_level_only=False):
            if _internal(imp) and imp != m:
                bad.extend(f"{p.relative_to(SRC)}:{line}: {imp}.{n}" for n in names if n.startswith("_"))
    assert bad == []


RULES = {
    # (importing package, forbidden prefix)
    "compatlab.config": (
        "compatlab.stages",
        "compatlab.runs",
        "compatlab.runner",
        "compatlab.render",
        "compatlab.cli",
        "compatlab.cells",
        "compatlab.envs",
        "compatlab.shard",
    ),
    "compatlab.stages": ("compatlab.cli", "compatlab.runner", "compatlab.render"),
    "compatlab.index": ("compatlab.cli", "compatlab.stages", "compatlab.runner", "compatlab.render"),
    # every module of compatlab but errors and urls: stages/ and index/ import net, so it imports none of them
    "compatlab.net": (
        "compatlab.cells",
        "compatlab.cli",
        "compatlab.config",
        "compatlab.envs",
        "compatlab.host",
        "compatlab.incell",
        "compatlab.index",
        "compatlab.plan",
        "compatlab.proc",
        "compatlab.render",
        "compatlab.resolver",
        "compatlab.runner",
        "compatlab.runs",
        "compatlab.shard",
        "compatlab.stages",
    ),
    "compatlab.render": (
        "compatlab.stages",
        "compatlab.runner",
        "compatlab.cli",
        "compatlab.config",
        "compatlab.cells",
        "compatlab.envs",
        "compatlab.shard",
    ),
}


def test_who_may_import_whom() -> None:
    bad: list[str] = []
    for m, p in MODULES.items():
        for package, forbidden in RULES.items():
            if m == package or m.startswith(package + "."):
                bad.extend(
                    f"{m} imports {imp} (line {line})"
                    for imp, _, line in _imports(p, top_level_only=False)
                    if imp.startswith(forbidden)
                )
    assert bad == []


# What each module of the middle (a module at compatlab's top, not a package) may import of compatlab, by its
# top-level name: the house's middle floor, each module below its users. A module that is not here fails
# test_every_middle_module_has_a_row; an import that is not in its row (the upward envs -> stages.base that
# was) fails test_the_middle_imports_only_what_is_below_it.
MIDDLE: Mapping[str, frozenset[str]] = {
    "__main__": frozenset({"cli"}),
    "errors": frozenset(),
    "urls": frozenset(),
    "resolver": frozenset(),  # uv's words, read by text
    "proc": frozenset({"errors", "incell"}),
    "site": frozenset({"errors", "incell"}),
    "net": frozenset({"errors", "urls"}),
    "parallel": frozenset({"errors"}),
    "host": frozenset({"errors", "proc"}),
    "gpulease": frozenset({"errors", "incell", "proc"}),
    "cells": frozenset({"config", "errors", "runs"}),
    "shard": frozenset({"cells", "config", "errors"}),
    "plan": frozenset({"errors", "runs"}),
    "reporter": frozenset({"runs"}),
    "venvs": frozenset({"cells", "errors"}),
    "envs": frozenset({"cells", "config", "errors", "index", "proc", "resolver", "runs", "urls"}),
    "uv_failures": frozenset({"cells", "config", "envs", "errors", "index", "proc", "resolver", "runs", "urls"}),
    "existing": frozenset({"cells", "config", "errors", "proc", "runs", "site"}),
    "runner": frozenset(
        {
            "cells",
            "config",
            "envs",
            "errors",
            "existing",
            "gpulease",
            "host",
            "parallel",
            "plan",
            "proc",
            "reporter",
            "runs",
            "shard",
            "site",
            "stages",
            "uv_failures",
            "venvs",
        }
    ),
}
MIDDLE_MODULES = sorted(
    m.removeprefix("compatlab.") for m, p in MODULES.items() if m.count(".") == 1 and p.name != "__init__.py"
)


def test_every_middle_module_has_a_row() -> None:
    assert sorted(MIDDLE) == MIDDLE_MODULES


def test_the_middle_imports_only_what_is_below_it() -> None:
    bad: list[str] = []
    for name in MIDDLE_MODULES:
        module = f"compatlab.{name}"
        for imp, _, line in _imports(MODULES[module], top_level_only=False):
            target = _internal(imp)
            if target and target != module and target.split(".")[1] not in MIDDLE.get(name, frozenset()):
                bad.append(f"{module}:{line}: {imp}")
    assert bad == []


def test_the_middle_rows_are_floors() -> None:
    """No row lets a module import one whose row lets it back, however far round: the rows are a hierarchy."""
    seen: dict[str, int] = {}
    circles: list[str] = []

    def visit(name: str, path: tuple[str, ...]) -> None:
        seen[name] = 1
        for below in sorted(MIDDLE.get(name, frozenset()) & set(MIDDLE)):
            if seen.get(below) == 1:
                circles.append(" -> ".join([*path[path.index(below) :], below]))
            elif below not in seen:
                visit(below, (*path, below))
        seen[name] = 2

    for name in MIDDLE:
        if name not in seen:
            visit(name, (name,))
    assert circles == []


# No room holds several things: a source file over MAX_LINES lines is two files, to be cut at its seams.
MAX_LINES = 650


def test_no_source_file_is_over_max_lines() -> None:
    lines = {
        p.relative_to(PACKAGE).as_posix(): len(p.read_text(encoding="utf-8").splitlines())
        for p in sorted(PACKAGE.rglob("*.py"))
    }
    over = {f: n for f, n in lines.items() if n > MAX_LINES}
    assert over == {}, f"over {MAX_LINES} lines: cut it at its seams"


# What runs/ may import of compatlab besides itself: errors, urls, the cause table (incell/causes.py) and the
# import stage's entry (incell/entries.py, read by runs/records/suite.py), leaves on the standard library alone.
RUNS_MAY_IMPORT = ("compatlab.errors", "compatlab.urls", "compatlab.incell.causes", "compatlab.incell.entries")


def test_runs_imports_nothing_above_it() -> None:
    bad: list[str] = []
    for m, p in MODULES.items():
        if not m.startswith("compatlab.runs"):
            continue
        for imp, _, line in _imports(p, top_level_only=False):
            top = imp.split(".")[0]
            if imp.startswith("compatlab.runs") or imp in RUNS_MAY_IMPORT or top in sys.stdlib_module_names:
                continue
            bad.append(f"{m}:{line}: {imp}")
    for leaf in RUNS_MAY_IMPORT:
        bad.extend(
            f"{leaf}:{line}: {imp} (runs/ imports it: a leaf imports no other module of compatlab)"
            for imp, _, line in _imports(MODULES[leaf], top_level_only=False)
            if _internal(imp) and imp != leaf
        )
    assert bad == []


FORMATTERS = tuple(dict.fromkeys(f.module for f in FORMATS))
FORMATTERS_READ = ("compatlab.render.view", "compatlab.render.text", "compatlab.render._assets")


def test_the_formatters_read_the_view_and_not_each_other() -> None:
    bad: list[str] = []
    for m in FORMATTERS:
        for imp, _, line in _imports(MODULES[m], top_level_only=False):
            if imp.startswith("compatlab.render") and imp not in FORMATTERS_READ:
                bad.append(f"{m}:{line}: {imp}")
    assert bad == []


def test_a_circle_closed_under_type_checking_is_a_circle(tmp_path: Path) -> None:
    """The nccl circle as it was (ranks.py and report.py, each importing the other for type checking)."""
    package = tmp_path / "compatlab" / "nccl"
    package.mkdir(parents=True)
    (package / "ranks.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from compatlab.nccl.report import NcclReport\n"
    )
    (package / "report.py").write_text(
        "import typing\nif typing.TYPE_CHECKING:\n    from compatlab.nccl.ranks import RankProcess\n"
    )
    modules = {"compatlab.nccl.ranks": package / "ranks.py", "compatlab.nccl.report": package / "report.py"}
    assert _circles(modules, tmp_path) == [["compatlab.nccl.ranks", "compatlab.nccl.report", "compatlab.nccl.ranks"]]


INCELL = sorted(m for m in MODULES if m.startswith("compatlab.incell"))
UNDER_PYTEST = ("compatlab.incell.plugin", "compatlab.incell.runpytest", "compatlab.incell.suites.")


def test_incell_imports_only_the_standard_library_and_itself() -> None:
    bad: list[str] = []
    for m in INCELL:
        allowed = {"pytest"} if m.startswith(UNDER_PYTEST) else set()
        for imp, _, line in _imports(MODULES[m], top_level_only=False):
            top = imp.split(".")[0]
            if imp.startswith("compatlab.incell") or top in sys.stdlib_module_names or top in allowed:
                continue
            if top == "torch" or top in {"sgl_kernel", "flashinfer"}:
                continue  # the cell's own stack, imported where the cell is the point
            bad.append(f"{m}:{line}: {imp}")
    assert bad == []


def _docstrings(tree: ast.Module) -> set[int]:
    nodes = [
        n for n in ast.walk(tree) if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
    ]
    return {
        id(n.body[0].value)
        for n in nodes
        if n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)
    }


KIND_NAMES = frozenset(
    name
    for axis, kind in AXIS_KINDS.items()
    if not kind.required and kind.package is not None
    for name in (axis, kind.package, *kind.imports)
)
KIND_TABLE = "compatlab.config.axes"
# incell/ cannot read the table; serve and perf start SGLang's server, and know it by name (and so does the
# serve stage's record, which keeps the SGLang version it served with).
KIND_EXEMPT = ("compatlab.incell", "compatlab.stages.serve", "compatlab.stages.perf", "compatlab.runs.records.serve")


def test_only_the_axis_kind_table_spells_a_kinds_names() -> None:
    bad: list[str] = []
    for m, p in MODULES.items():
        if m == KIND_TABLE or m.startswith(KIND_EXEMPT):
            continue
        tree = ast.parse(p.read_text(encoding="utf-8"))
        docs = _docstrings(tree)
        bad.extend(
            f"{p.relative_to(SRC)}:{node.lineno}: {node.value!r}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and node.value in KIND_NAMES and id(node) not in docs
        )
    assert bad == []


def c_programs(source: str) -> list[int]:
    """The lines of *source* where an argv list or tuple holds ``"-c"``: a program in a string."""
    return sorted(
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.List | ast.Tuple)
        and any(isinstance(e, ast.Constant) and e.value == "-c" for e in node.elts)
    )


def test_the_program_checker_finds_a_program_in_a_string() -> None:
    snippet = 'code = "print(1)"\nargv = [python, "-c", code]\nok = (python, "-m", "compatlab.incell.probe")\n'
    assert c_programs(snippet) == [2]
    assert c_programs('run((sys.executable, "-I", "-c", "import torch"), timeout=9)') == [1]


def test_no_program_runs_from_a_string() -> None:
    bad = [
        f"{p.relative_to(SRC)}:{line}" for p in MODULES.values() for line in c_programs(p.read_text(encoding="utf-8"))
    ]
    assert bad == []


def state_literals(source: str) -> list[int]:
    """The lines of *source* that compare a ``.state`` with a string, or pass one as ``state=``: a misspelt
    state there would be invisible to mypy; a misspelt ``StageState``/``CellState`` member is not."""

    def words(node: ast.expr) -> bool:
        elts = node.elts if isinstance(node, ast.Tuple | ast.List | ast.Set) else [node]
        return any(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in elts)

    lines: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(isinstance(s, ast.Attribute) and s.attr == "state" for s in sides) and any(map(words, sides)):
                lines.add(node.lineno)
        elif isinstance(node, ast.keyword) and node.arg == "state" and words(node.value):
            lines.add(node.value.lineno)
    return sorted(lines)


def test_the_state_checker_finds_a_state_spelt_as_a_string() -> None:
    snippet = (
        'if result.state == "fial":\n    pass\n'  # spellchecker:disable-line
        "ok = stage.state in (StageState.PASS, StageState.WARN)\n"
        'bad = cell.state not in ("pass", "partial")\n'
        'StageResult(name="x", state="skip")\n'
    )
    assert state_literals(snippet) == [1, 4, 5]


def test_states_are_enums_outside_the_cell() -> None:
    """incell/ runs on the standard library of Python 3.10 and keeps its own strings; the lab uses the enums."""
    bad = [
        f"{p.relative_to(SRC)}:{line}"
        for m, p in MODULES.items()
        if not m.startswith("compatlab.incell")
        for line in state_literals(p.read_text(encoding="utf-8"))
    ]
    assert bad == []


def test_names_are_compared_by_packagings_canonicalize_name_outside_the_cell() -> None:
    """PEP 503's ``re.sub(r"[-_.]+", "-", name).lower()`` is written once for the lab, in packaging; incell/, on the
    standard library alone, keeps its own."""
    bad = [
        f"{p.relative_to(SRC)}:{n}"
        for m, p in MODULES.items()
        if not m.startswith("compatlab.incell")
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if "[-_.]+" in line
    ]
    assert bad == []


def test_test_files_have_unique_names() -> None:
    """The test folders are not packages, so pytest imports each test file by its base name: two files of one
    name fail collection in a clean clone ("import file mismatch"), as tests/unit/.../test_causes.py did."""
    tests = Path(__file__).resolve().parents[1]
    names: dict[str, list[str]] = {}
    for path in tests.rglob("test_*.py"):
        if "fixtures" not in path.relative_to(tests).parts:
            names.setdefault(path.name, []).append(path.relative_to(tests).as_posix())
    assert {n: p for n, p in names.items() if len(p) > 1} == {}


# A stage's details (and a static finding's) are read and written by key only in runs/records/
# (``XDetails.of(result)``, ``record.to_details()``, ``Finding``'s properties): a path (or folder) and how many
# reads it may keep; none may today.
DETAILS_BY_KEY = re.compile(r'details\.get\(|details\["|\.details\[')
DETAILS_READ_ALLOWED: dict[str, int] = {}


def details_reads(root: Path) -> dict[str, int]:
    """How many times each file under *root* reads or writes a stage's details by key, by path below *root*'s
    parent, records/ left out."""
    found: dict[str, int] = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).as_posix()
        if rel.startswith("compatlab/runs/records/"):
            continue
        if n := len(DETAILS_BY_KEY.findall(path.read_text(encoding="utf-8"))):
            found[rel] = n
    return found


def excess_details_reads(found: Mapping[str, int]) -> list[str]:
    out = []
    for folder in sorted({next((a for a in DETAILS_READ_ALLOWED if rel.startswith(a)), rel) for rel in found}):
        n = sum(c for rel, c in found.items() if rel.startswith(folder))
        if n > DETAILS_READ_ALLOWED.get(folder, 0):
            out.append(
                f"{folder}: {n} reads of a stage's details by key (allowed {DETAILS_READ_ALLOWED.get(folder, 0)})"
            )
    return out


def test_the_details_checker_finds_a_read_by_key(tmp_path: Path) -> None:
    pkg = tmp_path / "compatlab"
    (pkg / "render").mkdir(parents=True)
    (pkg / "runs" / "records").mkdir(parents=True)
    (pkg / "render" / "page.py").write_text('x = stage.details.get("figures")\ny = s.details["tp"]\n', encoding="utf-8")
    (pkg / "runs" / "records" / "serve.py").write_text('tp = result.details.get("tp")\n', encoding="utf-8")
    assert details_reads(pkg) == {"compatlab/render/page.py": 2}
    assert excess_details_reads(details_reads(pkg)) == [
        "compatlab/render/page.py: 2 reads of a stage's details by key (allowed 0)"
    ]


def test_stage_details_are_read_by_key_only_in_the_records() -> None:
    found = details_reads(PACKAGE)
    assert excess_details_reads(found) == []
    kept = {folder: sum(c for rel, c in found.items() if rel.startswith(folder)) for folder in DETAILS_READ_ALLOWED}
    assert kept == DETAILS_READ_ALLOWED, "fewer reads by key than allowed: lower DETAILS_READ_ALLOWED to what is left"
