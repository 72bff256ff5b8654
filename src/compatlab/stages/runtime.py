"""The runtime stages: import (every extension module loaded, in the cell) and cuda (driver, arch, real ops).

Both run a compat suite with the cell's own interpreter (``suite.run_suite``). ``compatlab runtime``
runs them on an existing venv without a matrix, e.g. on a GPU box::

    compatlab runtime --venv /tmp/cell --stage import --stage cuda --out reports/adhoc
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from compatlab.config.matrix import DEFAULT_PACKAGES
from compatlab.config.thresholds import Thresholds, suite_thresholds
from compatlab.errors import LabError, UsageError
from compatlab.runs.model import CellResult, StageResult, cell_state, write_json_atomic
from compatlab.stages.base import CellContext
from compatlab.stages.pins import cuda_of_torch

__all__ = ["STAGES", "context_for_venv", "main", "run_cuda_stage", "run_import_stage"]

log = logging.getLogger(__name__)


def run_import_stage(ctx: CellContext) -> StageResult:
    """Load every extension module of the cell's packages, each in its own process (compat/test_import.py).

    Fails when a module cannot load for a reason of the stack (undefined symbol, missing library, crash,
    hang, Python ImportError); on a machine without a driver a stand-in libcuda.so.1 is used and said so.
    """
    from compatlab.stages.suite import run_suite

    return run_suite(ctx, "import")


def run_cuda_stage(ctx: CellContext) -> StageResult:
    """Driver, device arch and one real op per library (incell/suites/test_cuda.py); skipped without a GPU.

    Required: a skip here (no GPU on this machine) makes the cell 'partial', not 'pass'.
    """
    from compatlab.stages.suite import run_suite

    return run_suite(ctx, "cuda", required=True)


STAGES = {"import": run_import_stage, "cuda": run_cuda_stage}

# Distribution -> axis name, where the axis is not called after its distribution.
_AXIS_OF = {dist: axis for axis, dist in DEFAULT_PACKAGES.items()}
_INSPECT = r"""
import importlib.metadata as md, json, sys, sysconfig
out = {"purelib": sysconfig.get_paths()["purelib"], "packages": {}, "python": sys.executable}
for d in sys.argv[1:]:
    try:
        out["packages"][d] = md.version(d)
    except md.PackageNotFoundError:
        out["packages"][d] = None
try:  # torch/version.py says which CUDA it was built for, without importing torch
    out["torch_version_py"] = open(md.distribution("torch").locate_file("torch/version.py"), encoding="utf-8").read()
except Exception:
    out["torch_version_py"] = None
print(json.dumps(out))
"""


def context_for_venv(
    venv: Path,
    *,
    packages: Sequence[str],
    work_dir: Path,
    cuda: str | None = None,
    target_archs: Sequence[str] = (),
    min_driver: str | None = None,
    python: Path | None = None,
    thresholds: Thresholds | None = None,
) -> CellContext:
    """A CellContext for an existing venv, with the installed versions of *packages* as the cell's axes."""
    from compatlab.cells import Cell, cell_id
    from compatlab.config.matrix import Axis, AxisValue, Matrix, Target
    from compatlab.proc import run

    py = python or venv / "bin" / "python"
    if not py.exists():
        raise UsageError(f"{py} does not exist; give --venv a virtual environment (or --python)")
    done = run([str(py), "-c", _INSPECT, *packages], timeout=120)
    if not done.ok:
        raise UsageError(f"could not inspect {py}: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
    info = json.loads(done.stdout)
    missing = [d for d, v in info["packages"].items() if v is None]
    if missing:
        raise UsageError(f"not installed in {venv}: {', '.join(missing)}")
    values = [AxisValue(axis=_AXIS_OF.get(d, d), version=v, package=d) for d, v in info["packages"].items()]
    cuda = cuda or cuda_of_torch(info.get("torch_version_py"), info["packages"].get("torch"))
    if cuda:
        values.append(AxisValue(axis="cuda", version=cuda))
    targets: tuple[Target, ...] = ()
    if target_archs or min_driver:
        targets = (Target(name="this-box", arch=tuple(target_archs), min_driver=min_driver),)
    matrix = Matrix(path="<command line>", name="adhoc", axes=tuple(Axis(name=v.axis, values=(v,)) for v in values),
                    targets=targets, thresholds=thresholds or Thresholds())
    cell = Cell(id=cell_id(tuple(values)), values=tuple(values))
    work_dir.mkdir(parents=True, exist_ok=True)
    return CellContext(matrix=matrix, cell=cell, venv=venv, python=py, site_packages=Path(info["purelib"]),
                       work_dir=work_dir)


def main(argv: Sequence[str] | None = None) -> int:
    """``compatlab runtime``: run the import and/or cuda stage on an existing venv."""
    parser = argparse.ArgumentParser(prog="compatlab runtime", description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=Path, required=True, help="the cell's virtual environment")
    parser.add_argument("--python", type=Path, default=None, help="its interpreter (default VENV/bin/python)")
    parser.add_argument("--stage", action="append", choices=sorted(STAGES), help="repeatable; default both")
    parser.add_argument("--package", action="append", default=None,
                        help="a distribution of the stack (repeatable); default torch, sgl-kernel, "
                             "flashinfer-python, those installed")
    parser.add_argument("--cuda", default=None, help="the cell's CUDA version (default: from torch's +cuXY)")
    parser.add_argument("--arch", action="append", default=[], help="target SM arch, e.g. sm_90 (repeatable)")
    parser.add_argument("--min-driver", default=None, help="the target's minimum driver, e.g. 580.65")
    parser.add_argument("--threshold", action="append", default=[], metavar="KEY=SECONDS",
                        help="e.g. import-timeout=120, cuda-op-timeout=180, jit-timeout=900 (repeatable)")
    parser.add_argument("--out", type=Path, required=True, help="folder for results.json and the logs")
    parser.add_argument("--debug", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING, format="%(message)s")
    try:
        thresholds = suite_thresholds(_thresholds(args.threshold), source="--threshold")
        packages = args.package or _installed_defaults(args.venv, args.python)
        ctx = context_for_venv(args.venv.absolute(), packages=packages, work_dir=args.out.absolute() / "work",
                               cuda=args.cuda, target_archs=args.arch, min_driver=args.min_driver,
                               python=args.python, thresholds=thresholds)
        started = time.monotonic()
        for name in args.stage or ["import", "cuda"]:
            result = STAGES[name](ctx)
            ctx.previous.append(result)
            why = f" — {result.reason}" if result.reason else ""
            print(f"{name}: {result.state} ({result.seconds:.1f} s){why}", flush=True)
            # Written after every stage, so a run cut short still leaves what it found.
            cell = CellResult(id=ctx.cell.id, axes=ctx.cell.axes, state=cell_state(ctx.previous),
                              stages=list(ctx.previous), seconds=time.monotonic() - started,
                              reason=next((s.reason for s in ctx.previous if s.state in ("fail", "error")), ""))
            write_json_atomic(args.out / "results.json", cell.to_json())
        print(f"cell {cell.id}: {cell.state}")
    except LabError as exc:
        if args.debug:
            raise
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


def _thresholds(items: Sequence[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for item in items:
        key, sep, value = item.partition("=")
        try:
            out[key.strip()] = float(value)
        except ValueError:
            sep = ""
        if not sep or not key.strip():
            raise UsageError(f"--threshold {item!r}: expected KEY=SECONDS, e.g. jit-timeout=600")
    return out


def _installed_defaults(venv: Path, python: Path | None) -> list[str]:
    from compatlab.proc import run

    py = python or venv / "bin" / "python"
    wanted = ["torch", "sgl-kernel", "flashinfer-python"]
    done = run([str(py), "-c", _INSPECT, *wanted], timeout=120)
    if not done.ok:
        raise UsageError(f"could not inspect {py}: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
    return [d for d, v in json.loads(done.stdout)["packages"].items() if v is not None]

