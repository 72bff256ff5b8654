"""The cause of a failed SGLang start, read from its log: real logs of SGLang 0.5.17 on the H200 first.

tests/fixtures/serve_logs/h200-*.log are the servers' own logs from the one-GPU H200 device machine
(scripts/device/serve-h200.sh), kept as they came: each names what an expert would name.
"""

from __future__ import annotations

from pathlib import Path

from compatlab.runs.model import StageState
from compatlab.stages.serve.causes import Phase, find_cause, tracebacks

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
        "CUDA graph failed (prefill runner, backend breakable): RuntimeError: The size of tensor a (3072) must "
        "match the size of tensor b (1024) at non-singleton dimension 1 (in "
        "sglang/srt/model_executor/runner/prefill_cuda_graph_runner.py:1585)",
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


# Triton 3.6 compiling a kernel whose ptxas (TRITON_PTXAS_PATH to an older toolkit) does not know the GPU: ptxas's
# CalledProcessError, then Triton's PTXASError carrying ptxas's stderr, raised while handling it (its
# backends/nvidia/compiler.py make_cubin), as the scheduler logs the chain.
PTXAS = """\
[2026-12-04 10:02:11 TP0] Load weight end. elapsed=0.09 s, type=LlamaForCausalLM, avail mem=138.91 GB
[2026-12-04 10:02:12 TP0] Capture cuda graph begin. This can take up to several minutes. avail mem=106.4 GB
[2026-12-04 10:02:13 TP0] Scheduler hit an exception: Traceback (most recent call last):
  File "/v/lib/python3.12/site-packages/triton/backends/nvidia/compiler.py", line 555, in make_cubin
    subprocess.run(ptxas_cmd, check=True, close_fds=False, stderr=flog)
  File "/usr/lib/python3.12/subprocess.py", line 571, in run
    raise CalledProcessError(retcode, process.args,
subprocess.CalledProcessError: Command '['/opt/cuda-11.8/bin/ptxas', '-lineinfo', '-v', '--gpu-name=sm_90a', \
'/tmp/tmpx.ptx', '-o', '/tmp/tmpx.ptx.o']' returned non-zero exit status 255.

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "/v/lib/python3.12/site-packages/sglang/srt/managers/scheduler.py", line 4947, in run_scheduler_process
    scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank)
  File "/v/lib/python3.12/site-packages/sglang/srt/layers/sampler.py", line 88, in forward
    top_k_renorm_prob(probs, top_k)
  File "/v/lib/python3.12/site-packages/triton/runtime/jit.py", line 419, in <lambda>
    return lambda *args, **kwargs: self.run(grid=grid, warmup=False, *args, **kwargs)
  File "/v/lib/python3.12/site-packages/triton/compiler/compiler.py", line 320, in compile
    next_module = compile_ir(module, metadata)
  File "/v/lib/python3.12/site-packages/triton/backends/nvidia/compiler.py", line 587, in make_cubin
    raise PTXASError(error)
triton.runtime.errors.PTXASError: PTXAS error: Internal Triton PTX codegen error
`ptxas` stderr:
ptxas fatal   : Value 'sm_90a' is not defined for option 'gpu-name'

Repro command: /opt/cuda-11.8/bin/ptxas -lineinfo -v --gpu-name=sm_90a /tmp/tmpx.ptx -o /tmp/tmpx.ptx.o

[2026-12-04 10:02:14] Received sigquit from a child process. It usually means the child failed.
"""


def test_a_ptxas_that_does_not_know_the_gpu_is_told_by_ptxas_and_triton() -> None:
    """The translation that carries the tool's stderr is the root, not the CalledProcessError before it (issue
    31); Triton raised it, the caller is kept; the phase is the JIT build, not the graph capture around it."""
    cause = find_cause(PTXAS, arch="sm_90")
    assert cause is not None
    assert (cause.state, cause.reason) == (
        "fail",
        "JIT build (Triton's ptxas) failed: triton.runtime.errors.PTXASError: PTXAS error: Internal Triton PTX "
        "codegen error — ptxas fatal : Value 'sm_90a' is not defined for option 'gpu-name' (in "
        "triton/backends/nvidia/compiler.py:587, called from sglang/srt/layers/sampler.py:88)",
    )
    assert (cause.raised_in, cause.phase, cause.where) == ("triton", Phase.JIT, "sglang/srt/layers/sampler.py:88")
    assert cause.exception.startswith("triton.runtime.errors.PTXASError")


def test_an_explicit_cause_stays_the_root_and_a_plain_translation_does_not_win() -> None:
    """An explicit cause ("The above exception was the direct cause …"): the first is the root, whatever the second says; and a
    handler's own error that carries no tool output does not replace the exception it was handling."""
    explicit = PTXAS.replace(
        "During handling of the above exception, another exception occurred:",
        "The above exception was the direct cause of the following exception:",
    )
    cause = find_cause(explicit, arch="sm_90")
    assert cause is not None
    assert cause.exception.startswith("subprocess.CalledProcessError: Command ")
    plain = CHAINED.replace(
        "Possible solutions:\n1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n", ""
    )
    cause = find_cause(plain, arch="sm_90")
    assert cause is not None
    assert cause.exception.startswith("torch.AcceleratorError: CUDA error: no kernel image")


NO_PTXAS = """\
[2026-12-04 10:05:40 TP0] Capture cuda graph begin. This can take up to several minutes. avail mem=106.4 GB
[2026-12-04 10:05:41 TP0] Scheduler hit an exception: Traceback (most recent call last):
  File "/v/lib/python3.12/site-packages/sglang/srt/layers/sampler.py", line 88, in forward
    top_k_renorm_prob(probs, top_k)
  File "/v/lib/python3.12/site-packages/triton/backends/nvidia/compiler.py", line 514, in make_cubin
    ptxas = get_ptxas(self.target.arch).path
  File "/v/lib/python3.12/site-packages/triton/knobs.py", line 217, in transform
    raise RuntimeError(f"Cannot find {self.binary}")
RuntimeError: Cannot find ptxas
"""


def test_triton_s_missing_ptxas_is_triton_s_not_its_caller_s() -> None:
    cause = find_cause(NO_PTXAS, arch="sm_90")
    assert cause is not None
    assert cause.reason == (
        "JIT build (Triton's ptxas) failed: RuntimeError: Cannot find ptxas (in triton/knobs.py:217, called from "
        "sglang/srt/layers/sampler.py:88)"
    )
    assert cause.raised_in == "triton"


def _at(marks: str, exc: str = "RuntimeError: boom") -> str:
    return (
        marks + "[2026-12-04 10:00:09 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
        '  File "/v/lib/python3.12/site-packages/sglang/srt/model_loader/loader.py", line 12, in load\n'
        "    x()\n" + exc + "\n"
    )


def test_sglang_s_phases_are_read_from_what_it_logged_before() -> None:
    """Each phase from SGLang 0.5.17's own lines on the H200 (h200-eagle3-two-layers.log)."""
    cases = {
        "": (Phase.START, "RuntimeError: boom (in sglang/srt/model_loader/loader.py:12)"),
        "[2026-12-04 10:00:01 TP0] Load weight begin. avail mem=139.09 GB\n": (
            Phase.MODEL_LOAD,
            "model load failed: RuntimeError: boom (in sglang/srt/model_loader/loader.py:12)",
        ),
        "[2026-12-04 10:00:01 TP0] Load weight end. elapsed=0.09 s\n"
        "[2026-12-04 10:00:02 TP0] Capture target verify CUDA graph begin. backend=full, num_tokens_per_req=4\n": (
            Phase.GRAPH,
            "CUDA graph capture failed (target verify): RuntimeError: boom (in sglang/srt/model_loader/loader.py:12)",
        ),
        "[2026-12-04 10:00:02 TP0] Capture draft decode CUDA graph end. elapsed=4.92 s\n"
        "[2026-12-04 10:00:03] INFO:     Uvicorn running on http://127.0.0.1:57099 (Press CTRL+C to quit)\n": (
            Phase.FIRST_REQUEST,
            "first request failed: RuntimeError: boom (in sglang/srt/model_loader/loader.py:12)",
        ),
    }
    for marks, (phase, reason) in cases.items():
        cause = find_cause(_at(marks))
        assert cause is not None
        assert (cause.phase, cause.reason) == (phase, reason), marks
    imported = find_cause(_at("", "ModuleNotFoundError: No module named 'IPython'"))
    assert imported is not None
    assert imported.phase == Phase.IMPORT


# Real Triton 3.8 (sglang 0.5.23's) compiling one kernel for sm_90 on this CPU machine (triton.compile with
# GPUTarget("cuda", 90, 32): the same make_cubin the GPU box runs), with TRITON_CACHE_DIR empty:
#   cpu-triton38-ptxas-refuses.log  TRITON_PTXAS_PATH at tests/fixtures/ptxas-refuses (answers --version as CUDA
#                                   12.8's ptxas, refuses the arch in CUDA 11.8's ptxas's own words)
#   cpu-triton38-no-ptxas.log       a linked copy of that Triton without backends/nvidia/bin/ptxas
#   cpu-triton38-ptxas-11.8.log     TRITON_PTXAS_PATH at CUDA 11.8's real ptxas (nvidia-cuda-nvcc-cu11 11.8.89):
#                                   Triton writes PTX 7.8 for it, and its LLVM aborts the process


def test_real_triton_with_a_ptxas_that_refuses_the_arch() -> None:
    assert _reason("cpu-triton38-ptxas-refuses.log") == (
        "fail",
        "JIT build (Triton's ptxas) failed: triton.runtime.errors.PTXASError: PTXAS error: Internal Triton PTX "
        "codegen error — ptxas fatal : Value 'sm_90a' is not defined for option 'gpu-name' (in "
        "triton/backends/nvidia/compiler.py:590)",
    )


def test_real_triton_without_its_ptxas() -> None:
    assert _reason("cpu-triton38-no-ptxas.log") == (
        "fail",
        "JIT build (Triton's ptxas) failed: RuntimeError: Cannot find ptxas (in triton/knobs.py:218)",
    )


def test_real_triton_with_an_old_ptxas_aborts_in_llvm() -> None:
    cause = find_cause((LOGS / "cpu-triton38-ptxas-11.8.log").read_text(encoding="utf-8"), arch="sm_90")
    assert cause is not None
    assert (cause.state, cause.phase) == ("fail", Phase.JIT)
    assert cause.reason.startswith(
        "JIT build (LLVM) failed: LLVM ERROR: PTX version 7.8 does not support target 'sm_90a'. Minimum required PTX "
        "version is 8.0."
    )
