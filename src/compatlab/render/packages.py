"""The per-package table of ``compatlab check``: each checked distribution, its modules and what each stage
said of them (packages.md and packages.json beside the one-cell grid)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from packaging.utils import canonicalize_name

from compatlab.runs.model import CellResult, StageState
from compatlab.runs.records.pins import PinsDetails
from compatlab.runs.records.static import Severity, StaticDetails
from compatlab.runs.records.suite import SuiteDetails

__all__ = ["PackageRow", "package_rows", "packages_json", "packages_md"]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class PackageRow:
    """One checked distribution: its modules and what each stage said of them."""

    name: str
    version: str
    state: StageState  # fail, warn or pass
    modules: int
    messages: tuple[str, ...]  # failures first, then warnings

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "state": self.state.value,
            "modules": self.modules,
            "messages": list(self.messages),
        }


def package_rows(result: CellResult, packages: Sequence[tuple[str, str]]) -> list[PackageRow]:
    """The per-package table: each checked distribution (*packages*: name and version) with its modules and
    the findings that name it."""
    names = {canonicalize_name(name): (name, version) for name, version in packages}
    fails: dict[str, list[str]] = {n: [] for n in names}
    warns: dict[str, list[str]] = {n: [] for n in names}
    modules: dict[str, set[str]] = {n: set() for n in names}
    for stage in result.stages:
        if stage.name == "static":
            static = StaticDetails.of(stage)
            for f in static.findings:
                dist = canonicalize_name(f.dist)
                if dist in names and f.severity in (Severity.FAIL, Severity.WARN):
                    (fails if f.severity == Severity.FAIL else warns)[dist].append(f"static: {f.message}")
            for name, mods in (static.modules_by_dist or {}).items():
                if canonicalize_name(name) in modules:
                    modules[canonicalize_name(name)].update(mods)
        elif stage.name == "import":
            for entry in SuiteDetails.of(stage).entries():
                dist = canonicalize_name(entry.dist)
                if dist not in names:
                    continue
                if not entry.is_package:
                    modules[dist].add(entry.module)
                if entry.failure and entry.reason:
                    bucket = warns if entry.needed is False else fails
                    if entry.failure.get("kind") == "missing-dependency":
                        bucket = warns
                    bucket[dist].append(f"import: {entry.verdict or entry.reason}")
        for msg in PinsDetails.of(stage).failures if stage.name == "pins" else ():
            for n, value in names.items():
                if str(msg).lower().startswith(f"{value[0]} ".lower()):
                    fails[n].append(f"pins: {msg}")
    rows = []
    for n, (name, version) in names.items():
        state = StageState.FAIL if fails[n] else StageState.WARN if warns[n] else StageState.PASS
        rows.append(
            PackageRow(
                name=name or n,
                version=version,
                state=state,
                modules=len(modules[n]),
                messages=tuple(fails[n] + warns[n]),
            )
        )
    order = {StageState.FAIL: 0, StageState.WARN: 1, StageState.PASS: 2}
    rows.sort(key=lambda r: (order[r.state], r.name.lower()))
    return rows


def packages_md(rows: Sequence[PackageRow]) -> str:
    """packages.md: one Markdown row per checked distribution."""
    lines = ["| package | version | state | modules | what |", "| --- | --- | --- | --- | --- |"]
    for r in rows:
        what = "<br>".join(m.replace("|", "\\|") for m in r.messages) or ""
        lines.append(f"| {r.name} | {r.version} | {r.state} | {r.modules} | {what} |")
    return "\n".join(lines) + "\n"


def packages_json(cell_id: str, state: str, rows: Sequence[PackageRow]) -> str:
    """packages.json: the cell, its state and the rows."""
    return json.dumps({"cell": cell_id, "state": state, "packages": [r.to_json() for r in rows]}, indent=2) + "\n"
