"""``compatlab lock``: resolve the axes of a matrix against their indexes and write its matrix.lock.

The resolving is compatlab.index.lock's; this module is the verb: it loads the matrix, keeps the old lock
when an index does not answer (exit 1), prints what was locked and the news, and with ``--news FILE``
writes the news as Markdown for the nightly changes.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from compatlab.cli.options import add_matrix, matrix_path
from compatlab.config.lock import load_lock, lock_path, news
from compatlab.config.matrix import load_matrix
from compatlab.errors import ConfigError, LabError
from compatlab.index import client
from compatlab.index.lock import news_markdown, resolve, write_lock

__all__ = ["configure_parser", "execute"]


def configure_parser(sub: Any) -> None:
    """Add ``lock`` to the verbs of ``compatlab``."""
    s = sub.add_parser("lock", help="resolve the axes' selectors against their indexes; write matrix.lock")
    add_matrix(s)
    s.add_argument(
        "--news",
        type=Path,
        metavar="FILE",
        help="also write the releases new since the previous lock here, as Markdown",
    )
    s.add_argument("--timeout", type=float, default=client.TIMEOUT, help="seconds for each index request")
    s.set_defaults(func=execute)


def execute(args: argparse.Namespace) -> int:
    path = matrix_path(args)
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
