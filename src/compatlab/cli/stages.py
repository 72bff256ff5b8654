"""Stages outside a matrix: `static` on a site-packages folder, `nccl` and `perf` on the GPUs present.

The import, cuda and serve stages on an existing environment are `compatlab check --stage NAME`."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from compatlab.cli.options import add_matrix, matrix_path
from compatlab.config import limits
from compatlab.errors import ConfigError, UsageError
from compatlab.runs.model import StageState

__all__ = ["configure_parser"]


def _cmd_static(args: argparse.Namespace) -> int:
    from compatlab.stages.static.elf import ElfCache
    from compatlab.stages.static.report import format_report
    from compatlab.stages.static.stage import check_site_packages

    report = check_site_packages(
        args.site_packages,
        archs=args.target,
        not_needed=args.not_needed,
        packages=args.package,
        cache=ElfCache(args.cache_dir),
        min_driver=args.min_driver,
        env=dict(os.environ),  # the compilers this environment's stack would call (toolchain.py)
    )
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        for line in format_report(report, args.verbose):
            print(line)
    return 1 if report.state == StageState.FAIL else 0


def _cmd_nccl(args: argparse.Namespace) -> int:
    from compatlab.config.nccl import NcclThresholds, NcclTimeouts
    from compatlab.runs.atomic import write_json_atomic
    from compatlab.stages.nccl.report import default_sizes
    from compatlab.stages.nccl.stage import probe, report_lines, run_nccl

    for flag in ("--world-size", "--sweeps", "--iters", "--warmup"):
        limits.check(flag, getattr(args, flag.removeprefix("--").replace("-", "_")))
    env = dict(os.environ)
    backend = args.backend
    if backend == "auto" or args.world_size is None:
        seen = probe(args.python, env)
        if backend == "auto":
            backend = "nccl" if seen["gpus"] > 0 and seen["nccl"] else "gloo"
    world = args.world_size or (seen["gpus"] if backend == "nccl" else 2)
    work = args.work_dir if args.work_dir is not None else Path(tempfile.mkdtemp(prefix="compatlab-nccl-"))
    try:
        report = run_nccl(
            args.python,
            world_size=world,
            backend=backend,
            env=env,
            timeouts=NcclTimeouts(
                init=args.timeout_init, correctness=args.timeout_correctness, bandwidth=args.timeout_bandwidth
            ),
            sizes=() if args.no_bandwidth else default_sizes(args.min_size, args.max_size, args.step),
            thresholds=NcclThresholds(min_busbw_gbps=args.min_busbw_gbps, source="--min-busbw-gbps"),
            work_dir=work,
            sweeps=args.sweeps,
            iters=args.iters,
            warmup=args.warmup,
            check_counts=args.check_counts,
        )
    except (RuntimeError, ValueError) as exc:
        raise UsageError(str(exc)) from exc
    if args.json is not None:
        write_json_atomic(
            args.json, {"state": report.state, "reason": report.reason, "seconds": report.seconds, **report.details()}
        )
    for line in report_lines(report):
        print(line)
    return 0 if report.state == StageState.PASS else 1


def _cmd_perf(args: argparse.Namespace) -> int:
    from compatlab.config.matrix import load_matrix
    from compatlab.stages.base import cell_env
    from compatlab.stages.perf.stage import EXIT_CODES, run_perf

    logging.getLogger().setLevel(logging.DEBUG if args.debug else logging.INFO)
    matrix = load_matrix(matrix_path(args))
    config = matrix.perf
    if config is None:
        raise ConfigError(matrix.path, ["perf: missing; add [perf.servers.baseline] and [perf.servers.eagle3]"])
    env = cell_env(args.venv) if args.venv else None
    report = run_perf(config, args.out, env=env)
    for c in config.concurrency:
        v = report.verdicts.get(str(c), {})
        f = report.figures
        if v:
            accept = f.get(f"accept_length_c{c}")
            print(
                f"c{c}: baseline {f[f'baseline_tok_s_c{c}']:.1f} tok/s, "
                f"eagle3 {f[f'eagle3_tok_s_c{c}']:.1f} tok/s, speedup {f[f'speedup_c{c}']:.2f}"
                + (f", accept length {accept:.2f}" if accept else "")
                + f": {v['verdict']}"
            )
    print(f"perf: {report.verdict}: {report.reason}")
    if report.log_tail:
        print("--- server log (tail) ---\n" + report.log_tail)
    print(f"results: {args.out / 'perf.json'}")
    return EXIT_CODES[report.verdict]


def configure_parser(sub: Any) -> None:
    from compatlab.incell.nccl_worker import GIB, MIB
    from compatlab.stages.nccl.stage import CHECK_COUNTS, parse_size

    s = sub.add_parser(
        "static",
        help="static checks of any site-packages: libraries, C++ symbols, GPU code",
        description="exit 1 when a module will not load, 0 when clean, 2 on bad usage",
    )
    s.add_argument("--site-packages", required=True, type=Path, metavar="DIR")
    s.add_argument(
        "--target", action="append", default=[], metavar="ARCH", help="device arch to cover, e.g. sm_90 (repeatable)"
    )
    s.add_argument(
        "--package",
        action="append",
        default=None,
        metavar="NAME",
        help="check only this top-level package (repeatable); default: all with .so files",
    )
    s.add_argument(
        "--not-needed",
        action="append",
        default=[],
        metavar="GLOB",
        help="modules that need not run on the targets, e.g. 'sgl_kernel/sm100/*'",
    )
    s.add_argument(
        "--min-driver",
        default=None,
        metavar="VERSION",
        help="the oldest NVIDIA driver the modules must load on, e.g. 550.54",
    )
    s.add_argument("--cache-dir", type=Path, default=None, help="default: $COMPATLAB_CACHE or ~/.cache/compatlab")
    s.add_argument("--json", action="store_true", help="print the report as JSON")
    s.add_argument("-v", "--verbose", action="store_true", help="list notes and every finding")
    s.set_defaults(func=_cmd_static)

    s = sub.add_parser("nccl", help="the NCCL suite with this interpreter's torch, and its figures")
    s.add_argument("--world-size", type=int, default=None, help="ranks (default: every visible GPU; gloo: 2)")
    s.add_argument("--backend", choices=("auto", "nccl", "gloo"), default="auto")
    s.add_argument("--python", type=Path, default=Path(sys.executable), help="interpreter with torch for the ranks")
    s.add_argument("--min-size", type=parse_size, default=MIB)
    s.add_argument("--max-size", type=parse_size, default=GIB)
    s.add_argument("--step", type=int, choices=(2, 4), default=2)
    s.add_argument("--no-bandwidth", action="store_true")
    s.add_argument(
        "--check-counts",
        type=lambda t: tuple(int(x) for x in t.split(",")),
        default=CHECK_COUNTS,
        help="elements per rank for the correctness checks, comma-separated",
    )
    s.add_argument("--sweeps", type=int, default=3)
    s.add_argument("--iters", type=int, default=20)
    s.add_argument("--warmup", type=int, default=5)
    s.add_argument("--min-busbw-gbps", type=float, default=None)
    s.add_argument("--timeout-init", type=float, default=180.0)
    s.add_argument("--timeout-correctness", type=float, default=180.0)
    s.add_argument("--timeout-bandwidth", type=float, default=600.0)
    s.add_argument("--work-dir", type=Path, default=None)
    s.add_argument("--json", type=Path, default=None, help="write the report here")
    s.set_defaults(func=_cmd_nccl)

    s = sub.add_parser(
        "perf",
        help="EAGLE-3 against its baseline, outside a cell",
        description="exit 0 pass, 1 fail, 2 bad input (matrix, missing ${VAR}), 3 error (a server "
        "hung or a program is missing), 4 inconclusive (rerun on a quieter box)",
    )
    add_matrix(s)
    s.add_argument(
        "--out", required=True, type=Path, help="directory for perf.json, benchmark.json and the server logs"
    )
    s.add_argument("--venv", type=Path, default=None, help="serve from this virtual environment (first on PATH)")
    s.set_defaults(func=_cmd_perf)
