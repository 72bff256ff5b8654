"""The flags several verbs share, declared once: ``--matrix`` (and where it points), ``--target``, and the
``--stage`` choices of the verbs that run check's stages, read from the pipeline itself."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

from compatlab.errors import UsageError

__all__ = ["DEFAULT_MATRIX", "add_matrix", "add_stages", "add_targets", "check_targets", "matrix_path"]

DEFAULT_MATRIX = "matrix.toml"


def add_matrix(s: argparse.ArgumentParser) -> None:
    s.add_argument("--matrix", help=f"matrix file (default: $COMPATLAB_MATRIX or ./{DEFAULT_MATRIX})")


def matrix_path(args: argparse.Namespace) -> str:
    """``--matrix``, else ``$COMPATLAB_MATRIX``, else ./matrix.toml."""
    return str(args.matrix or os.environ.get("COMPATLAB_MATRIX") or DEFAULT_MATRIX)


def add_targets(s: argparse.ArgumentParser) -> None:
    s.add_argument(
        "--target",
        action="append",
        default=[],
        metavar="ARCH",
        help="GPU arch its kernels must cover, e.g. sm_90 (repeatable)",
    )


def check_targets(targets: list[str]) -> None:
    """``--target`` values (check's and rehearse's): UsageError naming the bad one and an example."""
    from compatlab.incell.cudacompat import parse_arch

    for arch in targets:
        try:
            parse_arch(arch)
        except ValueError as exc:
            raise UsageError(f"--target {arch}: {exc}; e.g. --target sm_90") from None


def add_stages(s: argparse.ArgumentParser, choices: Sequence[str], *, help: str) -> None:
    """``--stage NAME`` (repeatable), one of *choices* (``runner.existing_stage_names``: the pipeline's)."""
    s.add_argument(
        "--stage",
        action="append",
        default=[],
        metavar="NAME",
        choices=tuple(choices),
        help=f"{help} (repeatable): {', '.join(choices)}",
    )
