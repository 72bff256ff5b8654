"""Stages: the Stage protocol, and the pipelines of `nox -s matrix` and `nox -s gpu8_perf`.

Cheap stages first. Each later stage still runs after an earlier red when its needs are met, because
diagnosis is the product. A new stage is one module and one line here.
"""

from __future__ import annotations

from compatlab.stages import install, pins, runtime
from compatlab.stages.base import CellContext, Installed, Stage
from compatlab.stages.nccl import stage as nccl
from compatlab.stages.perf import stage as perf
from compatlab.stages.serve import stage as serve
from compatlab.stages.static import stage as static

__all__ = ["GPU8", "PIPELINE", "CellContext", "Installed", "Stage"]

PIPELINE: tuple[Stage, ...] = (
    Stage(name="install", run=install.run_install_stage),
    Stage(name="pins", run=pins.run_pins_stage, needs=("install",)),
    Stage(name="static", run=static.run_static_stage, needs=("install",)),
    Stage(name="import", run=runtime.run_import_stage, needs=("install",)),
    Stage(name="cuda", run=runtime.run_cuda_stage, needs=("install",)),
    Stage(name="serve", run=serve.run_serve_stage, needs=("install",)),
)
# The 8-GPU stages of `nox -s gpu8_perf`, added to a cell's result after `nox -s matrix`.
GPU8: tuple[Stage, ...] = (
    Stage(name="serve", run=serve.run_serve_stage, needs=("install",)),
    Stage(name="nccl", run=nccl.run_nccl_stage, needs=("install",)),
    Stage(name="perf", run=perf.run_perf_stage, needs=("install",)),
)
