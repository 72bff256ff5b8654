"""``compatlab lock``: resolve the axes of a matrix against their indexes and write its matrix.lock.

Every package axis is locked: a selecting axis gets the versions its selector chooses (plus any it lists),
a listing axis keeps its listed versions; for each, the release's ``Requires-Dist`` pins on the other
axes and the CUDA its runtime dependency names are read from the index (compatlab.index). Nothing is
written unless every index answered: an unreachable index is an error (exit 1) and the old lock stays as
it was. The releases new since the previous lock are printed as news, and with ``--news FILE`` written
as Markdown for the nightly changes.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import tempfile
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name
from packaging.version import Version

from compatlab import index
from compatlab.config.lock import (
    Lock,
    LockedAxis,
    LockedRelease,
    Selector,
    cuda_of,
    dump_lock,
    load_lock,
    lock_path,
    news,
    pins_on,
)
from compatlab.config.matrix import AXIS_KINDS, Axis, Matrix, load_matrix
from compatlab.errors import ConfigError, LabError
from compatlab.urls import redact

__all__ = ["configure_parser", "execute", "news_markdown", "resolve", "write_lock"]

PYPI = "https://pypi.org/simple"


def configure_parser(sub: Any) -> None:
    """Add ``lock`` to the verbs of ``compatlab``."""
    s = sub.add_parser("lock", help="resolve the axes' selectors against their indexes; write matrix.lock")
    s.add_argument("--matrix", help="matrix file (default: $COMPATLAB_MATRIX or ./matrix.toml)")
    s.add_argument(
        "--news",
        type=Path,
        metavar="FILE",
        help="also write the releases new since the previous lock here, as Markdown",
    )
    s.add_argument("--timeout", type=float, default=index.TIMEOUT, help="seconds for each index request")
    s.set_defaults(func=execute)


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


def resolve(matrix: Matrix, *, timeout: float = index.TIMEOUT, now: str | None = None) -> tuple[Lock, list[str]]:
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
            found = index.releases(url, package, timeout=timeout)
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
                requires = index.requires_dist(index.core_metadata(url, release, timeout=timeout))
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
    path = Path(lock.path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(dump_lock(lock, matrix_name=matrix_name))
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def news_markdown(lines: list[str], previous: Lock | None) -> str:
    """The news of a lock as a changes.md section."""
    if previous is None:
        return "### Upstream releases\n\nNo previous lock to compare with: this is the first.\n"
    if not lines:
        return f"### Upstream releases\n\nNo release is new since the previous lock ({previous.resolved}).\n"
    items = "\n".join(f"- {line}" for line in lines)
    return f"### Upstream releases new since the previous lock ({len(lines)})\n\n{items}\n"


def execute(args: argparse.Namespace) -> int:
    path = str(args.matrix or os.environ.get("COMPATLAB_MATRIX") or "matrix.toml")
    matrix = load_matrix(path, use_lock=False)
    target = lock_path(path)
    try:
        previous = load_lock(target)
    except ConfigError as exc:
        print(f"note: the old lock cannot be read, it is replaced: {exc}")
        previous = None
    try:
        lock, notes = resolve(matrix, timeout=args.timeout)
    except LabError as exc:
        kept = f"{target} was not changed" + (f" (resolved {previous.resolved})" if previous else " (there is none)")
        raise LabError(f"{exc}\n{kept}; run `compatlab lock` again when the index answers") from None
    write_lock(lock, matrix_name=Path(path).name)
    lines = news(previous, lock)
    for name, axis in lock.axes.items():
        print(f"{name}: {', '.join(r.version for r in axis.versions)} ({axis.select}; {axis.index})")
    for note in notes:
        print(f"note: {note}")
    for line in lines:
        print(f"news: {line}")
    print(f"wrote {target}")
    if args.news is not None:
        args.news.parent.mkdir(parents=True, exist_ok=True)
        args.news.write_text(news_markdown(lines, previous), encoding="utf-8")
    return 0
