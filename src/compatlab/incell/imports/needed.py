"""Whether a module that failed to load is needed: what its distribution's package imports were seen to do.

A failed module of the stack is *needed* when one of its distribution's package imports mapped it or failed
on it (recorded a failed attempt of it and failed), or failed itself (it may need it), or when the
distribution has no package to import. A module that every one of those imports left alone or tried and went
on without (cupy tries cuTENSOR's module, which needs a library this box lacks), the imports having worked,
is not needed by ``import``: a lazily loaded part, an optional one, another build the package did not pick
(sm100 on this box, one CUDA major of two); it is marked ``needed=False``, a warning. A build its package may
pick by GPU stays needed: what this box's import loaded says nothing of the target's GPU. The static stage's
reading of the import graph (``static/not-needed.json`` in the cell's work folder: label -> {package, why, feature,
needed}), or the graph read here (compatlab.incell.reach), only adds what the package says the module is
for; a module static could not judge (``needed: unknown``) that this stage did not load stays a failure.

A module that fails loaded alone but that its package's own import mapped, the import having worked, loads
as users load it (opencv's ``cv2.abi3.so``, only ever loaded by ``cv2/__init__.py``): it counts as loaded.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from compatlab.incell import reach
from compatlab.incell.entries import ImportEntry
from compatlab.incell.imports.labels import real_path
from compatlab.incell.loading.elf import dynamic_symbols
from compatlab.incell.loading.failure import STACK_KINDS

__all__ = ["confirm_not_needed", "loaded_by_package", "own_mapped", "predicted", "undecided"]


def own_mapped(
    loaded: list[tuple[ImportEntry, list[str] | None]], owned: dict[str, dict[str, str]]
) -> list[ImportEntry]:
    """The entries, each package import's with what it mapped of its own distribution's shared objects (by
    label)."""

    def own(entry: ImportEntry, paths: list[str]) -> ImportEntry:
        mine = owned.get(entry.dist, {})
        return dataclasses.replace(entry, mapped=tuple(sorted({mine[p] for p in map(real_path, paths) if p in mine})))

    return [entry if paths is None else own(entry, paths) for entry, paths in loaded]


def _reach(
    site_packages: str | None, label: str, device_code: bool, graphs: dict[str, reach.ImportGraph]
) -> dict[str, str] | None:
    """What the package's import graph says of a module static did not judge: {package, why, feature,
    needed} when the import stage may find `import <package>` does not need it, else None. *graphs*: each
    package's graph, read once for all its modules (cuda-core's 37 failed modules read the `cuda` graph 37
    times, 2.6 s of sglang's environment)."""
    if not site_packages or not label.endswith(".so") or "/" not in label:
        return None
    sp = Path(site_packages)
    top = reach.package_of(sp, label)
    if top not in graphs:
        graphs[top] = reach.ImportGraph(sp, top)
    need = graphs[top].need(reach.dotted_name(label))
    if not need.confirmable(label, device_code=device_code):
        return None
    return {"package": top, "why": need.why, "feature": need.feature, "needed": need.needed}


def loaded_by_package(entries: list[ImportEntry]) -> list[ImportEntry]:
    """A module that fails loaded alone, but that its package's own `import` loaded (mapped, and the import
    succeeded), loads as users load it: opencv's cv2.abi3.so is only ever loaded by cv2/__init__.py's
    bootstrap, under the name `cv2`. It counts as loaded, saying so."""
    imports = [e for e in entries if e.is_package and e.ok]

    def judged(entry: ImportEntry) -> ImportEntry:
        if entry.failure is None or entry.is_package:
            return entry
        by = next((p for p in imports if p.dist == entry.dist and entry.module in (p.mapped or ())), None)
        if by is None:
            return entry
        return dataclasses.replace(
            entry,
            ok=True,
            loaded=f"by `import {by.module}`, which maps it; loaded alone, {entry.reason}",
            alone=entry.failure,
            failure=None,
            reason=None,
        )

    return [judged(e) for e in entries]


def predicted(work_dir: str | None) -> dict[str, dict[str, str]] | None:
    """static/not-needed.json: the modules static left to this stage; None when no static stage ran."""
    file = Path(work_dir or ".") / "static" / "not-needed.json"
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None if not file.parent.is_dir() else {}
    return data if isinstance(data, dict) else {}


def undecided(predicted: dict[str, dict[str, str]] | None, entries: list[ImportEntry]) -> list[str]:
    """Modules static could not judge (`import P` may need them) that this stage did not load: no one has
    looked, so they stay failures."""
    loaded = {e.module for e in entries}
    return [
        f"{label}: static could not tell whether `import {guess.get('package')}` needs it, and the import "
        "stage did not load it"
        for label, guess in sorted((predicted or {}).items())
        if guess.get("needed") == "unknown" and label not in loaded
    ]


def confirm_not_needed(
    predicted: dict[str, dict[str, str]] | None,
    entries: list[ImportEntry],
    site_packages: str | None = None,
    paths: dict[str, str] | None = None,
) -> list[ImportEntry]:
    """The entries, each failed module that its distribution's imports were *seen* not to need marked
    ``needed=False`` (a warning, not a failure), and the others told why they stay needed.

    Observed, whichever stages ran: a module is needed when one of its distribution's package imports mapped
    it or failed on it, or failed itself (it may need it), or when the distribution has no package to import.
    A module that every one of those imports left alone or tried and went on without, the imports having
    worked, is not needed by ``import``: a lazily loaded part, an optional one, another build the package did
    not pick (sm100 on this box, one CUDA major of two). The static stage's reading of the import graph
    (static/not-needed.json), or the graph read here, only adds what the package says the module is for.
    """
    imports: dict[str, list[ImportEntry]] = {}
    for e in entries:
        if e.is_package:
            imports.setdefault(e.dist, []).append(e)
    graphs: dict[str, reach.ImportGraph] = {}
    return [
        _confirmed(e, predicted or {}, imports.get(e.dist, []), site_packages, paths, graphs=graphs) for e in entries
    ]


def _attempt(package: ImportEntry, module: str) -> Mapping[str, Any] | None:
    return next((f for f in package.failed_loads or () if f.get("name") == module), None)


_WENT_WITHOUT = ("feature", "not-picked")  # failed_loads' judgements of a load the import worked without


def _tried(package: ImportEntry, module: str) -> bool:
    """The import mapped *module*, or tried it and failed on it: the import failed, or its judgement of the
    attempt is not one it worked without (the attempt was its ``cause``). One that worked after trying it
    (cupy tries cuTENSOR's module and goes on without it) left it alone as far as ``import`` goes: weighed as
    the others it left alone, its verdict saying it went on without it."""
    if module in (package.mapped or ()):
        return True
    attempt = _attempt(package, module)
    return attempt is not None and (not package.ok or attempt.get("judged") not in _WENT_WITHOUT)


def _confirmed(
    entry: ImportEntry,
    predicted: dict[str, dict[str, str]],
    packages: list[ImportEntry],
    site_packages: str | None,
    paths: dict[str, str] | None,
    *,
    graphs: dict[str, reach.ImportGraph],
) -> ImportEntry:
    if entry.failure is None or entry.is_package or entry.failure.get("kind") not in STACK_KINDS:
        return entry  # only a failure of the stack is weighed: one for want of a GPU needs a GPU to judge
    if not packages:
        return dataclasses.replace(entry, needed_why=f"{entry.dist} has no package to import it: it is loaded alone")
    tried = next((p for p in packages if _tried(p, entry.module)), None)
    if tried is not None:
        how = "loads it" if entry.module in (tried.mapped or ()) else "tried to load it and failed on it"
        return dataclasses.replace(entry, needed_why=f"`import {tried.module}` {how}")
    failed = next((p for p in packages if not p.ok or p.mapped is None), None)
    if failed is not None:
        return dataclasses.replace(entry, needed_why=f"`import {failed.module}` did not load, so it may need it")
    guess = predicted.get(entry.module)
    if guess is None:  # static did not judge it: read the file once, for both questions
        path = (paths or {}).get(entry.module)
        symbols = dynamic_symbols(path, keep=True) if path else None
        device_code = symbols is None or symbols.device_code
        guess = _reach(site_packages, entry.module, device_code, graphs)
    if guess is None and reach.picked_by_gpu(entry.module, device_code=device_code):
        return dataclasses.replace(
            entry,
            needed_why=f"a build its package may pick by GPU: whether `import {packages[0].module}` loads it here "
            "says nothing of the target's GPU",
        )
    package = packages[0].module if guess is None else guess.get("package", packages[0].module)
    said = f"; {guess['package']} says it is for: {guess['feature']}" if guess and guess.get("feature") else ""
    without = next((p for p in packages if _attempt(p, entry.module) is not None), None)
    if without is not None:
        verdict = (
            f"{entry.reason}; `import {without.module}` does not need it: it tried to load it and went on "
            f"without it{said} (what needs it will not work)"
        )
    elif guess is None:
        verdict = f"{entry.reason}; `import {package}` does not need it: it loads without trying to load it"
    elif guess.get("needed") == "unknown":  # the code could not say; what `import` did here does
        verdict = (
            f"{entry.reason}; `import {package}` does not need it here: it loads "
            f"without mapping it, though {guess.get('why', '')}{said}"
        )
    else:
        verdict = (
            f"{entry.reason}; `import {package}` does not need it: it loads "
            f"without mapping it ({guess.get('why', '')}){said}"
        )
    return dataclasses.replace(entry, needed=False, verdict=verdict)
