"""Resolve the axes of a matrix against their indexes into its matrix.lock (what ``compatlab lock`` runs).

Every package axis is locked: a selecting axis gets the versions its selector chooses (plus any it lists),
a listing axis keeps its listed versions; for each, the release's ``Requires-Dist`` pins on the other
axes and the CUDA its runtime dependency names are read from the index (client.py). Nothing is written
unless every index answered: an unreachable index is an error and the old lock stays as it was. The
releases new since the previous lock are the news (``news_markdown`` for the nightly changes.md).
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import Version

from compatlab.config.axes import AXIS_KINDS, Axis
from compatlab.config.lock import (
    Lock,
    LockedAxis,
    LockedRelease,
    Selector,
    cuda_of,
    dump_lock,
    lock_path,
    pins_on,
)
from compatlab.config.matrix import Matrix
from compatlab.errors import LabError
from compatlab.index import client
from compatlab.runs.atomic import write_atomic
from compatlab.urls import redact

__all__ = ["PYPI", "news_markdown", "resolve", "write_lock"]

PYPI = "https://pypi.org/simple"


def _package(axis: Axis) -> str | None:
    if axis.package:
        return axis.package
    if axis.values and axis.values[0].package:
        return axis.values[0].package
    kind = AXIS_KINDS.get(axis.name)
    return kind.package if kind else None


def _index_of(matrix: Matrix, axis: Axis) -> str | None:
    """The one index the axis's versions come from; None when its values name several."""
    if axis.index:
        return axis.index
    found = {v.index for v in axis.values}
    if len(found) > 1:
        return None
    one = next(iter(found), None)
    return one or matrix.install.default_index or PYPI


def resolve(matrix: Matrix, *, timeout: float = client.TIMEOUT, now: str | None = None) -> tuple[Lock, list[str]]:
    """The lock of *matrix* (loaded with ``use_lock=False``), and notes on what could not be locked.

    Raises LabError naming every index that did not answer; nothing is written here.
    """
    when = now or dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    axes = [a for a in matrix.axes if a.is_package]
    packages: dict[str, str] = {canonicalize_name(p): a.name for a in axes if (p := _package(a))}
    python = matrix.install.python
    locked: dict[str, LockedAxis] = {}
    notes: list[str] = []
    problems: list[str] = []
    for axis in axes:
        package, url = _package(axis), _index_of(matrix, axis)
        if package is None:
            continue
        if url is None:
            notes.append(f"axes.{axis.name}: not locked: its values come from several indexes")
            continue
        try:
            found = client.releases(url, package, timeout=timeout)
        except LabError as exc:
            problems.append(f"axes.{axis.name}: {exc}")
            continue
        by_version = {Version(r.version): r for r in found}
        listed = [v.version for v in axis.values]
        chosen = axis.select.choose([(r.version, r.yanked) for r in found]) if axis.select else []
        chosen += [v for v in listed if all(Version(v) != Version(c) for c in chosen)]
        chosen.sort(key=Version)
        if axis.select is not None and not chosen:
            problems.append(
                f"axes.{axis.name}: {axis.select.describe()} chooses no release of {package} on "
                f"{redact(url)} (it has {len(found)}, pre-releases and yanked ones left out)"
            )
            continue
        others = {name: a for name, a in packages.items() if a != axis.name}
        releases = []
        for version in chosen:
            release = by_version.get(Version(version))
            if release is None:
                notes.append(f"axes.{axis.name}: {package} {version} is not on {redact(url)}")
                releases.append(LockedRelease(version=version))
                continue
            try:
                requires = client.requires_dist(client.core_metadata(url, release, timeout=timeout))
            except LabError as exc:
                problems.append(f"axes.{axis.name}: {exc}")
                continue
            releases.append(
                LockedRelease(
                    version=version,
                    pins=pins_on(requires, others, python=python),
                    cuda=cuda_of(requires),
                    yanked=release.yanked,
                )
            )
        floor = min(Version(v) for v in chosen) if chosen else None
        window = (axis.select or Selector()).candidates([(r.version, r.yanked) for r in found])
        seen = [v for v in window if floor is None or Version(v) >= floor]
        locked[axis.name] = LockedAxis(
            name=axis.name,
            package=package,
            index=redact(url),
            resolved=when,
            select=axis.select.describe() if axis.select else "listed",
            versions=tuple(releases),
            seen=tuple(seen),
        )
    if problems:
        raise LabError(f"cannot resolve the axes of {matrix.path}:\n" + "\n".join(f"  {p}" for p in problems))
    return Lock(path=str(lock_path(matrix.path)), matrix_digest=matrix.digest, axes=locked), notes


def write_lock(lock: Lock, *, matrix_name: str) -> None:
    """Write *lock* to its path atomically (a temporary file renamed over the old one)."""
    write_atomic(Path(lock.path), dump_lock(lock, matrix_name=matrix_name))


def news_markdown(lines: list[str], previous: Lock | None) -> str:
    """The news of a lock as a changes.md section."""
    if previous is None:
        return "### Upstream releases\n\nNo previous lock to compare with: this is the first.\n"
    if not lines:
        return f"### Upstream releases\n\nNo release is new since the previous lock ({previous.resolved}).\n"
    items = "\n".join(f"- {line}" for line in lines)
    return f"### Upstream releases new since the previous lock ({len(lines)})\n\n{items}\n"
