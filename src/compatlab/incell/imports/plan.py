"""What the import stage loads, and in which order: the declared distributions' modules, read from RECORD.

Each declared distribution installed in the cell (loading.installed.Installed) gives its extension modules, loaded
by file path, and its top-level packages, imported by name. Its RECORD's extension modules built for
another Python (``import`` never finds them here), the shared objects it names outside the environment
(never read nor loaded) and a METADATA or RECORD that cannot be read are said as warnings; the rest of the
distribution is still loaded.

The targets are kept extension modules first: their failures name the file, and a package's import that
fails repeats them. They are loaded distribution by distribution in the order of their requirements
(METADATA's Requires-Dist, extras left out, names compared as PEP 503 does), each one's modules before its
package's import, which an adopting fork server then keeps: a module is never loaded after its own package,
and a package's import never before those it needs. What an earlier run on the same environment learned
(order.py: an adoption that imported another declared distribution's modules, which no Requires-Dist named)
puts that distribution before it too.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import re
import sys
from collections.abc import Mapping, Sequence

from compatlab.incell.imports.labels import record_label
from compatlab.incell.loading.installed import Installed, LoadTarget
from compatlab.incell.names import canonicalize_name

__all__ = ["Plan", "Survey", "by_requirements"]

_REQUIREMENT_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Survey:
    """The declared distributions (name -> version) as installed: ``installed`` those found, in the declared
    order; ``missing`` one line for each that is not."""

    installed: dict[str, Installed]
    missing: list[str]

    @classmethod
    def of(cls, packages: Mapping[str, str]) -> Survey:
        missing: list[str] = []
        surveyed: dict[str, Installed] = {}
        for dist, version in packages.items():
            try:
                surveyed[dist] = Installed(dist)
            except importlib.metadata.PackageNotFoundError:
                missing.append(f"{dist} {version} is declared but not installed in the cell")
        return cls(installed=surveyed, missing=missing)

    @property
    def versions(self) -> dict[str, str]:
        """The installed version of each distribution found."""
        return {dist: survey.version for dist, survey in self.installed.items()}

    @property
    def elf_files(self) -> list[str]:
        """Every shared object the distributions installed in the environment."""
        return [f for s in self.installed.values() for f in s.elf_files]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Plan:
    """``targets`` extension modules first; ``order`` their indices in the order to load them; ``owned``
    each distribution's shared objects (real path -> label); ``warnings`` what was not loaded, and why."""

    targets: list[LoadTarget]
    order: list[int]
    owned: dict[str, dict[str, str]]
    warnings: list[str]

    @classmethod
    def of(cls, surveyed: Mapping[str, Installed], before: Mapping[str, Sequence[str]] | None = None) -> Plan:
        """*before*: the order learned on this environment (imports.order), after the requirements."""
        targets: list[LoadTarget] = []
        owned: dict[str, dict[str, str]] = {}  # dist -> real path of each shared object it installed -> label
        warnings: list[str] = []
        for dist, survey in surveyed.items():
            found = survey.targets
            warnings.extend(
                f"{label}: built for another Python; {sys.implementation.cache_tag} never imports "
                "it, so it was not loaded"
                for label in survey.other_python
            )
            # Hostile or broken metadata: said for this distribution, the rest of it still loaded.
            warnings.extend(
                f"{dist}: its RECORD names {label}, outside the environment: never read nor loaded"
                for label in survey.outside
            )
            warnings.extend([f"{dist} {survey.version}: {survey.problem}"] if survey.problem else [])
            owned[dist] = {os.path.realpath(f): record_label(f, found) for f in survey.elf_files}
            targets.extend(found)
        # Extension modules first: their failures name the file; a package's import failure repeats them.
        targets.sort(key=lambda t: t.path is None)
        # Distributions in the order of their requirements (what others need first), each one's modules
        # before its package's import, which the server then adopts: a module is never loaded after its
        # own package, and a package's import after those it needs. The entries keep the targets' order.
        rank = {dist: i for i, dist in enumerate(by_requirements(surveyed, before))}
        order = sorted(range(len(targets)), key=lambda i: (rank[targets[i].dist], targets[i].path is None))
        return cls(targets=targets, order=order, owned=owned, warnings=warnings)

    @property
    def paths(self) -> dict[str, str]:
        """The file of each extension module, by label."""
        return {t.label: t.path for t in self.targets if t.path is not None}


def by_requirements(surveyed: Mapping[str, Installed], before: Mapping[str, Sequence[str]] | None = None) -> list[str]:
    """The distributions, each after those of them it requires (its METADATA's Requires-Dist, extras left
    out) and then those *before* names for it (learned: imports.order): the order in which an adopting
    server has what a package needs before the package is imported. A circle is broken where it is met; an
    unreadable METADATA requires nothing."""
    names = {canonicalize_name(d): d for d in surveyed}
    needs: dict[str, list[str]] = {}
    for dist, survey in surveyed.items():
        try:
            requires = survey.dist.requires or []
        except Exception:  # noqa: BLE001 - broken metadata is said elsewhere; here it orders nothing
            requires = []
        found = (_REQUIREMENT_NAME.match(r) for r in requires if "extra" not in r.partition(";")[2])
        needs[dist] = [
            names[canonicalize_name(m.group(1))] for m in found if m and canonicalize_name(m.group(1)) in names
        ] + [d for d in (before or {}).get(dist, ()) if d in surveyed]
    order: list[str] = []
    seen: set[str] = set()

    def visit(dist: str) -> None:
        if dist in seen:
            return
        seen.add(dist)
        for need in needs.get(dist, []):
            visit(need)
        order.append(dist)

    for dist in sorted(surveyed):
        visit(dist)
    return order
