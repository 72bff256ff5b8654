"""cuda stage: driver against the cell's CUDA, the device's arch against torch's, one real op per library.

Runs inside the cell (see conftest.py) and needs an NVIDIA driver and GPU; elsewhere every test skips with
the reason. Each GPU operation (compatlab.incell.cuda_ops) runs in its own process with a timeout, so a hung
or crashing kernel fails the cell, not the run.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from compatlab.incell import cudacompat, fakecuda
from compatlab.incell.context import SuiteContext
from compatlab.incell.loading.failure import LoadFailure, classify, describe
from compatlab.incell.probe import RESULT_TAG
from compatlab.incell.proc import HERE, bytecode_prefix, module_command, run


def _record(stderr: str) -> dict[str, Any]:
    for line in reversed(stderr.splitlines()):
        if line.startswith(RESULT_TAG):
            data: dict[str, Any] = json.loads(line[len(RESULT_TAG) :])
            return data
    return {}


def _run_op(stage: Any, what: str, op: str, timeout: float, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run one GPU operation (compatlab.incell.cuda_ops *op*) in its own process; fail the stage with a
    classified reason if it broke."""
    command = module_command(sys.executable, "cuda_ops", op, root=HERE, bytecode=bytecode_prefix())
    done = run(command.argv, timeout=timeout, env=env or dict(os.environ), cwd=command.cwd)
    record = _record(done.stderr)
    if not (done.ok and record):  # it crashed, hung, or raised: say why as the import stage would
        failure = classify(done) or LoadFailure(kind="exit", message="wrote no result")
        stage.fail(describe(what, failure), failure=failure.to_json(), seconds=done.seconds)
    record["process_seconds"] = round(done.seconds, 2)
    return record


def _thresholds(ctx: SuiteContext, key: str, default: float) -> float:
    return ctx.threshold(key, default)


@functools.cache
def _driver_evidence() -> str | None:
    return fakecuda.real_driver()


def _need_driver(stage: Any) -> None:
    if _driver_evidence() is None:
        stage.skip(fakecuda.NO_DRIVER)


def _driver_version() -> tuple[str | None, str]:
    """The kernel driver's version (e.g. 580.159.03) and where it was read."""
    smi = shutil.which("nvidia-smi")
    if smi:
        done = run([smi, "--query-gpu=driver_version", "--format=csv,noheader"], timeout=60)
        first = done.stdout.strip().splitlines()[:1]
        if done.ok and first and re.fullmatch(r"\d+(\.\d+){0,2}", first[0].strip()):
            return first[0].strip(), "nvidia-smi"
    try:
        text = Path("/proc/driver/nvidia/version").read_text(encoding="utf-8")
        if m := re.search(r"Kernel Module\s+(\d+\.\d+(?:\.\d+)?)", text):
            return m.group(1), "/proc/driver/nvidia/version"
    except OSError:
        pass
    evidence = _driver_evidence() or ""
    if m := re.search(r"libcuda\.so\.(\d+\.\d+(?:\.\d+)?)", os.path.realpath(evidence.split()[-1]) if evidence else ""):
        return m.group(1), "libcuda.so file name"
    return None, "not found (no nvidia-smi, no /proc/driver/nvidia/version)"


_INFO_CACHE: dict[str, dict[str, Any]] = {}


def _info(stage: Any, ctx: SuiteContext) -> dict[str, Any]:
    if "info" not in _INFO_CACHE:
        _INFO_CACHE["info"] = _run_op(stage, "torch.cuda", "info", _thresholds(ctx, "cuda-op-timeout", 180))
    return _INFO_CACHE["info"]


def _need_gpu(stage: Any, ctx: SuiteContext) -> dict[str, Any]:
    _need_driver(stage)
    info = _info(stage, ctx)
    if not info.get("available"):
        stage.skip("blocked: torch sees no GPU (see test_device_arch)")
    return info


def test_driver(compat_context: SuiteContext, stage: Any) -> None:
    _need_driver(stage)
    info = _info(stage, compat_context)
    cuda = compat_context.cuda or info.get("torch_cuda")
    version, source = _driver_version()
    stage.note(
        driver=version,
        driver_source=source,
        driver_api=info.get("driver_api"),
        cuda=cuda,
        driver_evidence=_driver_evidence(),
    )
    checks: list[cudacompat.DriverCheck] = []
    if version and cuda:
        checks.append(cudacompat.check_driver(version, cuda))
    if info.get("driver_api") and cuda:
        checks.append(cudacompat.check_driver_api(int(info["driver_api"]), cuda))
    for target in compat_context.targets:
        if target.min_driver and version:
            checks.append(cudacompat.check_min_driver(version, target.min_driver, target.name))
    stage.note(driver_checks=[{"state": c.state, "reason": c.reason} for c in checks])
    failed = [c for c in checks if c.state == "fail"]
    if failed:
        stage.fail(failed[0].reason + (f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""))
    if not checks:
        stage.error(f"could not read the driver version ({source}) nor cuDriverGetVersion")
    if warns := [c.reason for c in checks if c.state == "warn"]:
        stage.note(driver_warnings=warns)


def test_device_arch(compat_context: SuiteContext, stage: Any) -> None:
    _need_driver(stage)
    info = _info(stage, compat_context)
    if not info.get("available"):
        stage.fail(
            f"torch {info.get('torch')} sees no GPU although a driver is installed: "
            f"{info.get('error', 'torch.cuda.is_available() is False')}",
            info=info,
        )
    cap = tuple(info["capability"])
    device = f"sm_{cap[0]}{cap[1]}"
    stage.note(
        device=info.get("name"),
        device_arch=device,
        devices=info.get("count"),
        torch_arch_list=info.get("arch_list"),
        torch=info.get("torch"),
        torch_cuda=info.get("torch_cuda"),
    )
    covered = cudacompat.arch_covers((cap[0], cap[1]), list(info.get("arch_list") or []))
    if covered is None:
        stage.fail(
            f"torch {info.get('torch')} has no code for {device} ({info.get('name')}): "
            f"built for {', '.join(info.get('arch_list') or []) or 'nothing'}"
        )
    assert covered is not None  # stage.fail does not return
    stage.note(arch_coverage=f"{covered.kind} ({covered.by})")
    archs = list(compat_context.archs)
    if archs and not cudacompat.arch_covers((cap[0], cap[1]), list(archs)):
        stage.note(target_arch_warning=f"{device} is not among the matrix targets' archs {archs}")


def test_torch_matmul(compat_context: SuiteContext, stage: Any) -> None:
    _need_gpu(stage, compat_context)
    rec = _run_op(stage, "torch matmul", "matmul", _thresholds(compat_context, "cuda-op-timeout", 180))
    stage.note(torch_matmul=rec)
    if not rec.get("ok"):
        stage.fail(rec.get("message", "torch matmul gave a wrong result"))


def test_sgl_kernel_op(compat_context: SuiteContext, stage: Any) -> None:
    if "sgl-kernel" not in compat_context.packages:
        stage.skip("the cell declares no sgl-kernel")
    _need_gpu(stage, compat_context)
    rec = _run_op(stage, "sgl_kernel op", "sgl-kernel", _thresholds(compat_context, "cuda-op-timeout", 180))
    stage.note(sgl_kernel_op=rec)
    if rec.get("skip"):
        stage.skip(rec.get("message", "no known sgl_kernel op"))
    if not rec.get("ok"):
        stage.fail(rec.get("message", "the sgl_kernel op gave a wrong result"))


def test_flashinfer_op(compat_context: SuiteContext, stage: Any) -> None:
    if "flashinfer-python" not in compat_context.packages:
        stage.skip("the cell declares no flashinfer-python")
    _need_gpu(stage, compat_context)
    env = dict(os.environ)
    if "FLASHINFER_WORKSPACE_BASE" not in env and os.environ.get("COMPATLAB_CACHE"):
        env["FLASHINFER_WORKSPACE_BASE"] = str(Path(os.environ["COMPATLAB_CACHE"]) / "flashinfer")
    started = time.monotonic()
    rec = _run_op(
        stage,
        "flashinfer op",
        "flashinfer",
        _thresholds(compat_context, "jit-timeout", 900),
        env=env,
    )
    rec["wall_seconds"] = round(time.monotonic() - started, 2)
    stage.note(flashinfer_op=rec)
    if not rec.get("ok"):
        stage.fail(rec.get("message", "the flashinfer op gave a wrong result"))
