"""import stage: every extension module of the stack, loaded in its own process with the cell's interpreter.

Runs inside the cell (see conftest.py). Each extension module is loaded by file path after ``import torch``,
as its package would load it, in a child forked from one interpreter that has imported torch once
(compatlab.incell.forkserver); with COMPATLAB_IMPORT_FORKSERVER=0, or when that interpreter cannot import torch, in
a fresh interpreter each. Either way two builds of one module (sgl_kernel's sm90/ and sm100/) never share a
process, and a crash or a hang takes only its own process down. On a machine with no NVIDIA driver a
stand-in libcuda.so.1 answers CUDA_ERROR_NO_DEVICE, so an ABI break still shows.

The machinery is compatlab.incell.imports (its docstring lists its modules); here is the test, which says
the verdict.
"""

from __future__ import annotations

import resource
import sys
from pathlib import Path
from typing import Any

from compatlab.incell import forkserver
from compatlab.incell.context import SuiteContext
from compatlab.incell.imports import attempts, needed
from compatlab.incell.imports.driver import Driver
from compatlab.incell.imports.load import load_plan
from compatlab.incell.imports.loader import Loader
from compatlab.incell.imports.order import LearnedOrder
from compatlab.incell.imports.plan import Plan, Survey
from compatlab.incell.imports.verdicts import Verdicts, and_more


def test_stack_imports(compat_context: SuiteContext, stage: Any) -> None:
    packages = dict(compat_context.packages)
    timeout = compat_context.threshold("import-timeout", 180)
    survey = Survey.of(packages)
    driver = Driver(compat_context.work_dir, survey.elf_files)
    stage.note(driver=driver.describe(), installed=survey.versions, python=sys.executable)
    if survey.missing:
        stage.fail(survey.missing[0] + and_more(survey.missing), missing=survey.missing)
    loader = Loader(driver, ["torch"] if "torch" in survey.installed else [], timeout, fork=forkserver.enabled())
    loader.prestart()  # the server imports torch while the modules to load are found
    order = LearnedOrder.at(Path(compat_context.keep), survey.installed)
    try:
        plan = Plan.of(survey.installed, order.before)
        loaded = load_plan(plan, driver, loader)
    finally:
        loader.close()
    kept = order.pairs
    learned = order.keep(loader.learned)
    own = resource.getrusage(resource.RUSAGE_SELF)  # this suite's process: the plan, the verdicts, the ELF reads
    stage.note(
        cpu={**loader.cpu(), "suite": {"self_user": round(own.ru_utime, 2), "self_system": round(own.ru_stime, 2)}},
        loader=loader.describe(),
        loader_problems=loader.problems + ([order.problem] if order.problem else []),
        order={"learned_before": kept, "learned_now": learned, "file": str(order.path or "")},
    )
    if driver.lib_dir is not None:
        stage.note(stand_in=str(driver.lib_dir / "libcuda.so.1"), stand_in_symbols=len(driver.symbols))
    entries = needed.loaded_by_package(needed.own_mapped(loaded, plan.owned))
    predicted = needed.predicted(compat_context.work_dir)
    entries = needed.confirm_not_needed(predicted, entries, compat_context.site_packages, plan.paths)
    verdicts = Verdicts.of(entries, compat_context.targets)
    stage.note(
        modules=[e.to_json() for e in entries],
        loaded=sum(e.ok for e in entries),
        total=len(entries),
        ignored=verdicts.ignored,
        needs_gpu=verdicts.needs_gpu,
        warnings=verdicts.undeclared
        + attempts.feature_warnings(entries)
        + plan.warnings
        + [f"needs a GPU to judge: {r}" for r in verdicts.needs_gpu],
    )
    undecided = needed.undecided(predicted, entries)
    broken = verdicts.broken + undecided
    codes = verdicts.codes + ["unclassified"] * len(undecided)  # the cause code of each, in incell/causes.py
    if broken:
        causes = [{"cause": c, "reason": r} for c, r in zip(codes, broken, strict=True)]
        stage.fail(broken[0] + and_more(broken), failures=broken, cause=codes[0], causes=causes)
    if verdicts.unjudged:
        unjudged = verdicts.unjudged
        stage.error(f"could not judge {unjudged[0]}{and_more(unjudged)}: {driver.describe()}", failures=unjudged)
    if not entries:
        stage.error("nothing to load: the cell declares no installed package with modules", packages=packages)
