"""A chained ImportError is told by its innermost cause, in a fresh interpreter and in a fork server's child.

The wheel, built here, loads its gcc-built library the way torch's ``torch.ops.load_library`` does: ctypes,
and on failure ``raise OSError("Could not load this library: …") from e``. The library needs a symbol of the
"old torch" that no one provides, so the cause is an undefined symbol.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from compatlab.incell import loadcheck
from compatlab.incell.forkserver import ForkServer
from compatlab.incell.loading.failure import LoadFailure, describe
from fixtures.sofix import compile_so
from fixtures.wheels import build_wheel, venv_with

SYMBOL = "_ZN3c104cuda29c10_cuda_check_implementationEiPKcS2_ib"
# The package re-raises once more, implicitly (during handling): two wrappers around the cause.
INIT = """
import ctypes, os

def load_library(path):
    try:
        ctypes.CDLL(path)
    except Exception as e:
        raise OSError(f"Could not load this library: {path}") from e

try:
    load_library(os.path.join(os.path.dirname(__file__), "lib", "libops.so"))
except OSError:
    raise ImportError("wrapped: its operators did not load")
"""


@pytest.fixture(scope="module")
def python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("chained")
    lib = compile_so(tmp / "libops.so", f"void {SYMBOL}(void);\nvoid ops(void) {{ {SYMBOL}(); }}\n")
    wheel = build_wheel(
        tmp / "wheels", "wrapped", "1.0", files={"wrapped/__init__.py": INIT, "wrapped/lib/libops.so": lib.read_bytes()}
    )
    return venv_with(tmp / "venv", [wheel])


def _expect(failure: LoadFailure | None, python: Path) -> None:
    assert failure is not None
    assert (failure.kind, failure.symbol) == ("undefined-symbol", SYMBOL)
    assert describe("wrapped", failure) == (
        "wrapped: undefined symbol c10::cuda::c10_cuda_check_implementation(int, char const*, char const*, int, bool)"
    )
    assert failure.outer[0] == "ImportError: wrapped: its operators did not load"
    assert failure.outer[1].startswith("OSError: Could not load this library: ")
    assert failure.outer[1].endswith("/site-packages/wrapped/lib/libops.so")
    assert len(failure.outer) == 2


def test_a_fresh_interpreter_reports_the_innermost_cause(python: Path) -> None:
    failure, _done = loadcheck.load_module(str(python), path=None, name="wrapped", timeout=60)
    _expect(failure, python)


def test_a_fork_server_child_reports_the_innermost_cause(python: Path) -> None:
    with ForkServer.start(str(python), preload=[], env=dict(os.environ), timeout=60) as server:
        failure, _done = server.load(path=None, name="wrapped", timeout=60)
    _expect(failure, python)
