"""A serve failure's headline keeps its facts (issue 31): the symbol is demangled with the C++ runtime's own
__cxa_demangle, so this test runs where processes may (finding libstdc++ asks ldconfig)."""

from __future__ import annotations

from pathlib import Path

from compatlab.stages.serve.causes import find_cause

LOGS = Path(__file__).resolve().parents[2] / "fixtures" / "serve_logs"


def test_a_headline_keeps_the_fact_its_error_details_give() -> None:
    """sglang-kernel 0.4.10 beside torch 2.11 (issue 31): the build is there, its symbols are not. sgl_kernel's
    message as 0.4.10 prints it, the details line as the loader words it (the H200 log of the sm90 case, with
    its build present and torch's symbol missing)."""
    log = (LOGS / "h200-no-sm90.log").read_text(encoding="utf-8")
    log = log.replace(" - found files: []", " - found files: ['common_ops.abi3.so']").replace(
        "- ModuleNotFoundError: No module named 'common_ops'",
        "- ImportError: /root/cell/lib/python3.12/site-packages/sgl_kernel/sm90/common_ops.abi3.so: undefined "
        "symbol: _ZN3c104cuda19CUDAErrorLogCaptureD1Ev",
    )
    cause = find_cause(log, arch="sm_90")
    assert cause is not None
    assert cause.reason == (
        "ImportError: [sgl_kernel] CRITICAL: Could not load any common_ops library! — undefined symbol "
        "c10::cuda::CUDAErrorLogCapture::~CUDAErrorLogCapture() (in sgl_kernel/load_utils.py:197)"
    )


def test_a_real_sgl_kernel_headline_keeps_the_undefined_symbol() -> None:
    """Real sgl_kernel 0.4.10 (sglang 0.5.23's) importing on this CPU machine, its sm100/common_ops replaced by
    tests/fixtures/fake_common_ops.c built with gcc (it needs the c10 destructor torch 2.11 lacks): the loader's
    own "Error details" hold the undefined symbol, and the reason keeps it, demangled."""
    cause = find_cause((LOGS / "cpu-sglkernel0410-abi.log").read_text(encoding="utf-8"), arch="sm_90")
    assert cause is not None
    assert cause.reason == (
        "ImportError: [sgl_kernel] CRITICAL: Could not load any common_ops library! — undefined symbol "
        "c10::cuda::CUDAErrorLogCapture::~CUDAErrorLogCapture() (in sgl_kernel/load_utils.py:192)"
    )
    assert cause.phase == "start-up (import)"
