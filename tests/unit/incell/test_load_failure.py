"""loading.failure: what the loader and Python said, as real loads say it, read as a kind, a cause code and one line.

The probe's record is written here as the probe writes it (``probe.steps``); the loads themselves, with gcc-built
modules in real interpreters, are in tests/e2e/incell/test_loadcheck.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from compatlab.incell.loading import cudamajor
from compatlab.incell.loading.failure import (
    STACK_KINDS,
    LoadFailure,
    classify,
    classify_attempt,
    classify_record,
    describe,
)
from compatlab.incell.proc import Completed


@pytest.fixture(autouse=True)
def _no_torch_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """An environment without torch or a CUDA runtime wheel: no CUDA major to compare a library's with."""
    monkeypatch.setattr(cudamajor, "env_cuda_major", lambda: None)


def _failed(step: str, exc_type: str, message: str, stderr: str = "") -> LoadFailure:
    done = Completed(argv=["python"], returncode=3, stdout="", stderr=stderr, seconds=0.1)
    failure = classify_record(done, {"ok": False, "step": step, "type": exc_type, "message": message})
    assert failure is not None
    return failure


# A module built for NumPy 1.x imported beside NumPy 2: NumPy's own words on stderr, then the ImportError.
NUMPY_1_BESIDE_2 = (
    "\nA module that was compiled using NumPy 1.x cannot be run in\n"
    "NumPy 2.0.2 as it may crash. To support both 1.x and 2.x\n"
    "versions of NumPy, modules must be compiled with NumPy 2.0.\n"
)


@pytest.mark.parametrize(
    ("target", "said", "stderr", "expected"),
    [
        (
            "x/_C.cpython-313-x86_64-linux-gnu.so",
            (
                "load /v/x/_C.cpython-313-x86_64-linux-gnu.so",
                "ImportError",
                "/v/x/_C.cpython-313-x86_64-linux-gnu.so: undefined symbol: _PyThreadState_UncheckedGet",
            ),
            "",
            (
                "undefined-symbol",
                "python-abi",
                "x/_C.cpython-313-x86_64-linux-gnu.so: undefined symbol _PyThreadState_UncheckedGet",
            ),
        ),
        (
            "flashinfer/_kernels.so",
            (
                "load /v/flashinfer/_kernels.so",
                "ImportError",
                "/lib/x86_64-linux-gnu/libstdc++.so.6: version `GLIBCXX_3.4.32' not found (required by "
                "/v/flashinfer/_kernels.so)",
            ),
            "",
            (
                "symbol-version",
                "symbol-version",
                "flashinfer/_kernels.so: symbol version GLIBCXX_3.4.32 not found (required by _kernels.so)",
            ),
        ),
        (
            "sgl_kernel/common_ops.abi3.so",
            (
                "load /v/sgl_kernel/common_ops.abi3.so",
                "OSError",
                "libnvrtc.so.12: cannot open shared object file: No such file or directory",
            ),
            "",
            (
                "missing-library",
                "missing-library",
                "sgl_kernel/common_ops.abi3.so: missing shared library libnvrtc.so.12",
            ),
        ),
        (
            "pandas",
            (
                "import pandas",
                "ImportError",
                "numpy.core.multiarray failed to import",
            ),
            NUMPY_1_BESIDE_2,
            (
                "numpy-abi",
                "numpy-abi",
                "pandas: built for NumPy 1.x, numpy 2.0.2 installed (numpy.core.multiarray failed to import); fix: "
                "`numpy<2`, or a release built for NumPy 2",
            ),
        ),
        (
            "torch",
            (
                "import torch",
                "RuntimeError",
                "Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU and installed a driver "
                "from http://www.nvidia.com/Download/index.aspx",
            ),
            "",
            (
                "no-driver",
                "needs-gpu",
                "torch: no NVIDIA driver (Found no NVIDIA driver on your system. Please check that you have an NVIDIA "
                "GPU and installed a driver from http://www.nvidia.com/Download/index.aspx)",
            ),
        ),
        (
            "sgl_kernel",
            (
                "import sgl_kernel",
                "ModuleNotFoundError",
                "No module named 'triton'",
            ),
            "",
            (
                "missing-dependency",
                "undeclared-dependency",
                "sgl_kernel imports triton, which is not installed: an undeclared dependency",
            ),
        ),
        (
            "sgl_kernel",
            (
                "import sgl_kernel",
                "ModuleNotFoundError",
                "No module named 'sgl_kernel.common_ops'",
            ),
            "",
            (
                "import-error",
                "import-error",
                "sgl_kernel: ModuleNotFoundError: No module named 'sgl_kernel.common_ops'",
            ),
        ),
    ],
)
def test_a_failed_load_is_named_by_its_cause(
    target: str, said: tuple[str, str, str], stderr: str, expected: tuple[str, str, str]
) -> None:
    """*said*: the record's step, and the type and message of the exception it names."""
    failure = _failed(*said, stderr)
    assert (failure.kind, failure.cause, describe(target, failure)) == expected
    assert failure.stack is (failure.kind in STACK_KINDS)


def test_a_missing_library_of_another_cuda_major_is_a_mix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cudamajor, "env_cuda_major", lambda: 13)
    failure = _failed(
        "load /v/sgl_kernel/common_ops.abi3.so",
        "OSError",
        "libnvrtc.so.12: cannot open shared object file: No such file or directory",
    )
    assert (failure.kind, failure.cause, failure.cuda_mix) == (
        "missing-library",
        "cuda-major-mix",
        {"library": 12, "env": 13},
    )
    assert failure.to_json()["cuda_mix"] == {"library": 12, "env": 13}
    assert describe("sgl_kernel/common_ops.abi3.so", failure) == (
        "sgl_kernel/common_ops.abi3.so: missing shared library libnvrtc.so.12, a CUDA 12 library in a CUDA 13 "
        "environment (built for another CUDA major than torch's)"
    )


def test_a_prerequisite_that_fails_is_the_story() -> None:
    failure = _failed(
        "import torch", "OSError", "libcudnn.so.9: cannot open shared object file: No such file or directory"
    )
    assert describe("sgl_kernel/common_ops.abi3.so", failure) == (
        "sgl_kernel/common_ops.abi3.so (import torch failed): missing shared library libcudnn.so.9"
    )
    own = _failed(
        "preload /v/vllm/libcumem_allocator.so",
        "OSError",
        "libcuda.so.1: cannot open shared object file: No such file or directory",
    )
    assert describe("vllm/_C.abi3.so", own) == (
        "vllm/_C.abi3.so (it needs libcumem_allocator.so of its own package, which does not load): "
        "no NVIDIA driver (libcuda.so.1)"
    )


@pytest.mark.parametrize(
    ("message", "kind", "expected"),
    [
        (
            "libcuda.so.1: cannot open shared object file: No such file or directory",
            "no-driver",
            "m.so: no NVIDIA driver (libcuda.so.1)",
        ),
        (
            "Found no NVIDIA driver on your system.",
            "no-driver",
            "m.so: no NVIDIA driver (Found no NVIDIA driver on your system.)",
        ),
        (
            "/lib/libstdc++.so.6: version `GLIBCXX_3.4.32' not found (required by /x/m.so)",
            "symbol-version",
            "m.so: symbol version GLIBCXX_3.4.32 not found (required by m.so)",
        ),
    ],
)
def test_classify_messages(message: str, kind: str, expected: str) -> None:
    tag = '{"ok": false, "step": "load m.so", "type": "ImportError", "message": %s}'
    done = Completed(
        argv=["py"],
        returncode=3,
        stdout="",
        seconds=0.1,
        stderr="Traceback...\nCOMPATLAB-LOAD-RESULT " + tag % json.dumps(message) + "\n",
    )
    failure = classify(done)
    assert failure is not None
    assert failure.kind == kind
    assert failure.stack is (kind in STACK_KINDS)
    assert describe("m.so", failure) == expected


def test_exit_without_result() -> None:
    done = Completed(argv=["py"], returncode=1, stdout="", stderr="Fatal Python error: boom\n", seconds=0.1)
    failure = classify(done)
    assert failure is not None
    assert describe("m.so", failure) == "m.so: exited with status 1: Fatal Python error: boom"


@pytest.mark.parametrize(
    ("done", "expected"),
    [
        (
            Completed(
                argv=["py"], returncode=-11, stdout="", stderr="Fatal Python error: Segmentation fault\n", seconds=1.0
            ),
            ("signal", "crash", "m.so: crashed with SIGSEGV while loading"),
        ),
        (
            Completed(argv=["py"], returncode=-9, stdout="", stderr="", seconds=180.2, timed_out=True),
            ("timeout", "hang", "m.so: hung while loading, killed after 180 s"),
        ),
        (
            Completed(argv=["py"], returncode=0, stdout="", stderr="", seconds=0.2),
            ("exit", "import-error", "m.so: exited 0 without a result"),
        ),
    ],
)
def test_a_process_that_ended_without_saying_why_is_named_by_how_it_ended(
    done: Completed, expected: tuple[str, str, str]
) -> None:
    failure = classify(done)
    assert failure is not None
    assert (failure.kind, failure.cause, describe("m.so", failure)) == expected


def test_a_failed_attempt_is_classified_as_a_failed_load() -> None:
    attempt: dict[str, Any] = {
        "ok": False,
        "name": "/v/torchvision/_C.so",
        "error": "OSError: libtorch_cuda.so: cannot open shared object file: No such file or directory",
    }
    failure = classify_attempt(attempt)
    assert failure is not None
    assert (failure.kind, failure.library, failure.step) == (
        "missing-library",
        "libtorch_cuda.so",
        "load /v/torchvision/_C.so",
    )
    assert classify_attempt({"ok": True, "name": "/v/torchvision/_C.so"}) is None
