"""The cuda suite's GPU operations, one per process: ``python -m compatlab.incell.cuda_ops OP``.

OP is one of ``info`` (the driver's API version, torch's CUDA, the device and torch's arch list), ``matmul``
(torch on the GPU against the CPU), ``sgl-kernel`` (its rmsnorm or silu_and_mul against torch) and
``flashinfer`` (its rmsnorm against torch, with the JIT's cost). Each writes what it found as one tagged
JSON line on stderr, as the import stage's probe does (``probe.RESULT_TAG``)::

    COMPATLAB-LOAD-RESULT {"ok": true, "max_abs_err": 0.0, ...}

and on an exception its traceback, then ``{"ok": false, "step": ..., "type": ..., "message": ...}``, and exits
3; a crash or a hang leaves no record, and ``loading.failure.classify`` says why from the process. The suite
(``suites/test_cuda.py``) runs each with a timeout, so a hung or crashing kernel fails the cell, not the run.
"""

from __future__ import annotations

import ctypes
import importlib
import json
import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from compatlab.incell.probe import RESULT_TAG

__all__ = ["OPS", "main"]


class _Op:
    """What an operation is doing now (the record's "step"), and how it reports."""

    def __init__(self) -> None:
        self.step = ""

    def report(self, **record: Any) -> None:
        record.setdefault("ok", True)
        sys.stderr.write(RESULT_TAG + json.dumps(record) + "\n")
        sys.stderr.flush()

    def torch(self) -> Any:
        self.step = "import torch"
        return importlib.import_module("torch")


def _ref_rmsnorm(x: Any, w: Any, eps: float) -> Any:
    torch = sys.modules["torch"]
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


def info(op: _Op) -> None:
    out: dict[str, Any] = {}
    op.step = "cuDriverGetVersion"
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        v = ctypes.c_int()
        rc = lib.cuDriverGetVersion(ctypes.byref(v))
        out["driver_api"] = v.value if rc == 0 else None
    except OSError as exc:
        out["driver_api_error"] = str(exc)
    torch = op.torch()
    out.update(torch=torch.__version__, torch_cuda=torch.version.cuda, available=torch.cuda.is_available())
    op.step = "torch.cuda"
    if out["available"]:
        out.update(
            count=torch.cuda.device_count(),
            capability=list(torch.cuda.get_device_capability(0)),
            name=torch.cuda.get_device_name(0),
            arch_list=torch.cuda.get_arch_list(),
        )
    else:
        try:
            torch.cuda.init()
        except Exception as exc:  # noqa: BLE001 - why torch sees no GPU is the finding
            out["error"] = f"{type(exc).__name__}: {exc}"
    op.report(**out)


def matmul(op: _Op) -> None:
    torch = op.torch()
    op.step = "matmul"
    torch.manual_seed(0)
    a, b = torch.randn(256, 512), torch.randn(512, 128)
    ref = a @ b
    t = time.monotonic()
    got = a.cuda() @ b.cuda()
    torch.cuda.synchronize()
    seconds = time.monotonic() - t
    err = (got.cpu() - ref).abs().max().item()
    scale = ref.abs().max().item()
    op.report(
        ok=err <= 1e-3 * max(scale, 1.0),
        max_abs_err=err,
        scale=scale,
        seconds=seconds,
        message=f"torch matmul on the GPU differs from the CPU by {err:.3g} (scale {scale:.3g})",
    )


def sgl_kernel(op: _Op) -> None:
    torch = op.torch()
    op.step = "import sgl_kernel"
    kernel = importlib.import_module("sgl_kernel")
    torch.manual_seed(0)
    x = torch.randn(8, 1024, device="cuda", dtype=torch.float16)
    if hasattr(kernel, "rmsnorm"):
        op.step = "sgl_kernel.rmsnorm"
        w = torch.randn(1024, device="cuda", dtype=torch.float16)
        got = kernel.rmsnorm(x, w, 1e-6)
        ref = _ref_rmsnorm(x, w, 1e-6)
    elif hasattr(kernel, "silu_and_mul"):
        op.step = "sgl_kernel.silu_and_mul"
        got = kernel.silu_and_mul(x)
        ref = (torch.nn.functional.silu(x[:, :512].float()) * x[:, 512:].float()).to(x.dtype)
    else:
        op.report(ok=False, skip=True, message="sgl_kernel has neither rmsnorm nor silu_and_mul")
        return
    torch.cuda.synchronize()
    err = (got.float() - ref.float()).abs().max().item()
    op.report(
        ok=err <= 2e-2, op=op.step, max_abs_err=err, message=f"{op.step} differs from the torch reference by {err:.3g}"
    )


def flashinfer(op: _Op) -> None:
    torch = op.torch()
    op.step = "import flashinfer"
    t = time.monotonic()
    fi = importlib.import_module("flashinfer")
    import_s = time.monotonic() - t
    cache: str | None = None
    try:
        jit_env = importlib.import_module("flashinfer.jit.env")
        cache = str(getattr(jit_env, "FLASHINFER_JIT_DIR", None) or jit_env.FLASHINFER_WORKSPACE_DIR)
    except Exception:  # noqa: BLE001 - where the JIT caches is a note; the op is the test
        cache = os.environ.get("FLASHINFER_WORKSPACE_BASE") or os.path.expanduser("~/.cache/flashinfer")
    op.step = "flashinfer.norm.rmsnorm"
    try:
        rmsnorm = importlib.import_module("flashinfer.norm").rmsnorm
    except (ImportError, AttributeError):
        rmsnorm = fi.rmsnorm
    torch.manual_seed(0)
    x = torch.randn(8, 1024, device="cuda", dtype=torch.float16)
    w = torch.randn(1024, device="cuda", dtype=torch.float16)
    t = time.monotonic()
    got = rmsnorm(x, w, eps=1e-6)
    torch.cuda.synchronize()
    first_s = time.monotonic() - t
    t = time.monotonic()
    rmsnorm(x, w, eps=1e-6)
    torch.cuda.synchronize()
    again_s = time.monotonic() - t
    err = (got.float() - _ref_rmsnorm(x, w, 1e-6).float()).abs().max().item()
    op.report(
        ok=err <= 2e-2,
        op=op.step,
        max_abs_err=err,
        import_seconds=import_s,
        first_call_seconds=first_s,
        jit_seconds=max(first_s - again_s, 0.0),
        again_seconds=again_s,
        jit_cache=cache,
        version=getattr(fi, "__version__", None),
        message=f"{op.step} differs from the torch reference by {err:.3g}",
    )


OPS: dict[str, Callable[[_Op], None]] = {
    "info": info,
    "matmul": matmul,
    "sgl-kernel": sgl_kernel,
    "flashinfer": flashinfer,
}


def main(argv: Sequence[str] | None = None) -> int:
    """``OP``: run one operation (the module's docstring); 3 when it raised, 2 for an unknown OP."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0] not in OPS:
        sys.stderr.write(f"usage: python -m compatlab.incell.cuda_ops {{{','.join(OPS)}}}\n")
        return 2
    op = _Op()
    try:
        OPS[args[0]](op)
    except BaseException as exc:  # noqa: BLE001 - whatever the op raised is the verdict
        traceback.print_exc()
        op.report(ok=False, step=op.step, type=type(exc).__name__, message=str(exc))
        return 3
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
