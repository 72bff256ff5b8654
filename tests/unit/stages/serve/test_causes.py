"""The cause of a failed SGLang start, read from its log: real logs of SGLang 0.5.17 on the H200 first.

tests/fixtures/serve_logs/h200-*.log are the servers' own logs from the one-GPU H200 device machine
(scripts/device/serve-h200.sh), kept as they came: each names what an expert would name.
"""

from __future__ import annotations

from pathlib import Path

from compatlab.runs.model import StageState
from compatlab.stages.serve.causes import find_cause, tracebacks

LOGS = Path(__file__).resolve().parents[3] / "fixtures" / "serve_logs"


def _reason(name: str) -> tuple[str, str] | None:
    cause = find_cause((LOGS / name).read_text(encoding="utf-8"), arch="sm_90")
    return None if cause is None else (cause.state, cause.reason)


def test_a_module_sglang_imports_at_start() -> None:
    assert _reason("h200-no-ipython.log") == (
        "fail",
        "ModuleNotFoundError: No module named 'IPython' (imported by sglang/utils.py:26)",
    )
    assert _reason("h200-no-numpy.log") == (
        "fail",
        "ModuleNotFoundError: No module named 'numpy' (imported by sglang/srt/utils/common.py:80)",
    )


def test_a_kernel_build_missing_for_the_gpu_names_the_package_and_its_message() -> None:
    assert _reason("h200-no-sm90.log") == (
        "fail",
        "ImportError: [sgl_kernel] CRITICAL: Could not load any common_ops library! — no file matches "
        "sgl_kernel/sm90/common_ops.* (in sgl_kernel/load_utils.py:197)",
    )


def test_the_scheduler_s_exception_wins_over_the_launcher_s_wrappers() -> None:
    log = (LOGS / "h200-eagle3-two-layers.log").read_text(encoding="utf-8")
    assert "Scheduler hit an exception" in log
    assert _reason("h200-eagle3-two-layers.log") == (
        "fail",
        "RuntimeError: The size of tensor a (3072) must match the size of tensor b (1024) at "
        "non-singleton dimension 1 (in sglang/srt/model_executor/runner/prefill_cuda_graph_runner.py:1585)",
    )


def test_a_library_without_its_cuda_flavour() -> None:
    state, reason = _reason("h200-no-ctk-flavor.log") or ("", "")
    assert state == "fail"
    assert reason.startswith("RuntimeError: No CTK flavor installed: expected one or more of ")
    assert reason.endswith("(in nvidia_cutlass_dsl/dsl_packages/cutlass/_mlir/_mlir_libs/__init__.py:110)")


CHAINED = """\
[2026-12-03 16:44:32 TP0] Scheduler hit an exception: Traceback (most recent call last):
  File "/v/lib/python3.12/site-packages/sglang/srt/model_executor/cuda_graph_runner.py", line 410, in capture
    self.capture_one_batch_size(bs)
  File "/v/lib/python3.12/site-packages/sgl_kernel/elementwise.py", line 88, in silu_and_mul
    torch.ops.sgl_kernel.silu_and_mul.default(out, input)
  File "/v/lib/python3.12/site-packages/torch/_ops.py", line 1255, in __call__
    return self._op(*args, **kwargs)
torch.AcceleratorError: CUDA error: no kernel image is available for execution on the device
Search for `cudaErrorNoKernelImageForDevice' in https://docs.nvidia.com/cuda/cuda-runtime-api/ for more information.

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "/v/lib/python3.12/site-packages/sglang/srt/managers/scheduler.py", line 4947, in run_scheduler_process
    scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank)
  File "/v/lib/python3.12/site-packages/sglang/srt/model_executor/cuda_graph_runner.py", line 418, in __init__
    raise Exception(
Exception: Capture cuda graph failed: CUDA error: no kernel image is available for execution on the device
Possible solutions:
1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)

[2026-12-03 16:44:33] Received sigquit from a child process. It usually means the child failed.
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "/v/lib/python3.12/site-packages/sglang/srt/entrypoints/engine.py", line 1700, in _launch_subprocesses
    raise RuntimeError("Initialization failed. Please see the error messages above.")
RuntimeError: Initialization failed. Please see the error messages above.
"""


def test_a_chained_graph_capture_failure_is_told_by_its_root() -> None:
    chain = tracebacks(CHAINED)
    assert [(tb.type, tb.chained) for tb in chain] == [
        ("torch.AcceleratorError", False),
        ("Exception", True),
        ("RuntimeError", False),
    ]
    cause = find_cause(CHAINED, arch="sm_120")
    assert cause is not None
    assert (cause.state, cause.reason) == (
        "fail",
        (
            "CUDA graph capture failed: no kernel image for sm_120 in sgl_kernel (in sgl_kernel/elementwise.py:88): "
            "torch.AcceleratorError: CUDA error: no kernel image is available for execution on the device"
        ),
    )
    assert cause.outer == (
        "Exception: Capture cuda graph failed: CUDA error: no kernel image is available for execution on the device"
    )


def test_out_of_memory_and_a_port_in_use_are_the_machine_s() -> None:
    oom = (
        "Traceback (most recent call last):\n"
        '  File "/v/lib/python3.12/site-packages/sglang/srt/mem_cache/memory_pool.py", line 77, in __init__\n'
        "    self.buffer = torch.zeros(size)\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n"
    )
    cause = find_cause(oom)
    assert cause is not None
    assert (cause.state, cause.reason) == (
        "error",
        "out of GPU memory (in sglang/srt/mem_cache/memory_pool.py:77): "
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
        "2.00 GiB.",
    )
    port = (
        "Traceback (most recent call last):\n"
        '  File "/usr/lib/python3.12/asyncio/base_events.py", line 1578, in create_server\n'
        "    sock.bind(sa)\n"
        "OSError: [Errno 98] error while attempting to bind on address ('127.0.0.1', 30000): "
        "address already in use\n"
    )
    cause = find_cause(port)
    assert cause is not None
    assert cause.state == StageState.ERROR
    assert cause.reason.startswith("the port is in use: OSError: [Errno 98]")


def test_a_log_without_an_exception_has_no_cause() -> None:
    assert find_cause("[2026-12-03 16:44:32] Load weight begin.\n[2026-12-03 16:44:33] Killed\n") is None
    only_wrapper = (
        'Traceback (most recent call last):\n  File "x.py", line 1, in <module>\n'
        "RuntimeError: Initialization failed. Please see the error messages above.\n"
    )
    assert find_cause(only_wrapper) is None


JIT = """\
[2026-12-03 16:50:01 TP0] Scheduler hit an exception: Traceback (most recent call last):
  File "/v/lib/python3.12/site-packages/sglang/srt/layers/attention/flashinfer_backend.py", line 120, in __init__
    self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")
  File "/v/lib/python3.12/site-packages/flashinfer/jit/core.py", line 300, in build_and_load
    run_ninja(self.build_dir, self.ninja_path, verbose)
  File "/v/lib/python3.12/site-packages/flashinfer/jit/cpp_ext.py", line 288, in run_ninja
    raise RuntimeError(msg) from None
RuntimeError: Ninja build failed. Ninja output:
[1/3] /usr/local/cuda/bin/nvcc -gencode=arch=compute_120a,code=sm_120a -c batch_prefill.cu -o batch_prefill.cuda.o
FAILED: batch_prefill.cuda.o
/v/flashinfer/data/include/flashinfer/attention/prefill.cuh(1021): error: identifier "__nv_fp8x4_e4m3" is undefined
1 error detected in the compilation of "batch_prefill.cu".
ninja: build stopped: subcommand failed.
"""


def test_a_kernel_jit_that_fails_names_nvcc_s_error() -> None:
    cause = find_cause(JIT)
    assert cause is not None
    assert (cause.state, cause.reason) == (
        "fail",
        (
            "flashinfer JIT: the kernel build failed (in flashinfer/jit/cpp_ext.py:288): "
            '/v/flashinfer/data/include/flashinfer/attention/prefill.cuh(1021): error: identifier "__nv_fp8x4_e4m3" '
            "is undefined"
        ),
    )


def test_a_long_compiler_line_keeps_its_end() -> None:
    generated = "/root/.cache/flashinfer/" + "generated/" * 40 + "batch_prefill_jit_binding.cu"
    log = JIT.replace(
        '/v/flashinfer/data/include/flashinfer/attention/prefill.cuh(1021): error: identifier "__nv_fp8x4_e4m3" '
        "is undefined",
        f"{generated}(3): fatal error: cutlass/numeric_types.h: No such file or directory",
    )
    cause = find_cause(log)
    assert cause is not None
    assert cause.reason.endswith(
        "batch_prefill_jit_binding.cu(3): fatal error: cutlass/numeric_types.h: No such file or directory"
    )
    assert " … " in cause.reason
