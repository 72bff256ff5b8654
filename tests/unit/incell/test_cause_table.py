"""The cause table: README.md shows it as the code has it, and every code a stage can name is in it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from compatlab.incell import causes
from compatlab.incell.loading import cudamajor
from compatlab.incell.loading.failure import STACK_KINDS, LoadFailure, classify_record, describe
from compatlab.incell.proc import Completed
from compatlab.runs.model import Blame, CellResult, CellState, StageResult, StageState
from compatlab.runs.records.static import Finding, Kind, Severity, StaticDetails
from compatlab.stages import blame

README = Path(__file__).resolve().parents[3] / "README.md"


def test_the_readme_shows_the_table_as_the_code_has_it() -> None:
    assert causes.markdown_table() in README.read_text(encoding="utf-8")


def test_every_load_failure_kind_has_a_code_of_the_table() -> None:
    for kind in [*STACK_KINDS, "no-driver", "missing-dependency"]:
        failure = LoadFailure(kind=kind, message="m")
        assert causes.is_known(failure.cause), kind


@pytest.mark.parametrize(
    ("symbol", "demangled", "code"),
    [
        (
            "_ZN3c104cuda29c10_cuda_check_implementationEiPKcS2_ib",
            "c10::cuda::c10_cuda_check_implementation(int, char const*, char const*, int, bool)",
            "torch-abi",
        ),
        ("_PyThreadState_UncheckedGet", None, "python-abi"),
        ("_ZN2ns5checkEi", "ns::check(int)", "abi-symbol"),
    ],
)
def test_an_undefined_symbol_is_named_by_whose_it_is(symbol: str, demangled: str | None, code: str) -> None:
    failure = LoadFailure(kind="undefined-symbol", message="m", symbol=symbol, demangled=demangled)
    assert failure.cause == code


def test_a_code_outside_the_table_is_refused() -> None:
    with pytest.raises(ValueError, match=re.escape("cause 'not-a-cause' is not a code of incell/causes.py")):
        StageResult(name="import", state=StageState.FAIL, cause="not-a-cause")


def test_each_stage_gets_a_code_and_a_cell_its_independent_causes() -> None:
    stages = (
        StageResult(name="install", state=StageState.PASS),
        StageResult(
            name="pins",
            state=StageState.FAIL,
            reason="a 1.0 and b 1.0 both install 1 file (a/x.py, all code) with different bytes",
            details={"file_clashes": [{"files": ["a/x.py"]}]},
        ),
        StageResult(
            name="static",
            state=StageState.FAIL,
            reason="m.so needs c10::f()",
            details=StaticDetails(
                findings=(
                    Finding(severity=Severity.FAIL, module="m.so", kind=Kind.SYMBOL, message="m.so needs c10::f()"),
                )
            ).to_details(),
        ),
        StageResult(
            name="import",
            state=StageState.FAIL,
            reason="m.so: undefined symbol c10::f()",
            cause="torch-abi",
            details={"causes": [{"cause": "torch-abi", "reason": "m.so: undefined symbol c10::f()"}]},
        ),
        StageResult(name="cuda", state=StageState.SKIP, reason="no driver"),
        StageResult(name="perf", state=StageState.ERROR, reason="lab error: boom"),
    )
    coded = [blame.with_cause(s).cause for s in stages]
    assert coded == ["", "file-clash", "torch-abi", "torch-abi", "not-run", "lab-error"]
    # Static's prediction of the symbol the import stage saw missing is the same cause, not a second one.
    assert blame.blames(stages) == (
        Blame(stage="pins", code="file-clash", reason=stages[1].reason),
        Blame(stage="import", code="torch-abi", reason="m.so: undefined symbol c10::f()"),
    )
    cell = CellResult(id="c", axes={}, state=CellState.FAIL, causes=blame.blames(stages))
    assert CellResult.from_json(cell.to_json()).causes == cell.causes


def _record(record: dict[str, object]) -> LoadFailure | None:
    done = Completed(argv=["python"], returncode=1, stdout="", stderr="", seconds=0.1)
    return classify_record(done, record)


def test_a_library_the_package_looked_up_and_did_not_find_is_missing() -> None:
    failure = _record(
        {"ok": False, "step": "import sounddevice", "type": "OSError", "message": "PortAudio library not found"}
    )
    assert failure is not None
    assert (failure.kind, failure.library, failure.cause) == ("missing-library", "PortAudio", "missing-library")


def test_a_handled_missing_module_yields_to_the_fallbacks_failure() -> None:
    """pyvips: `import _libvips` (API mode) is tried and handled; then ABI mode cannot dlopen libvips.so.42."""
    failure = _record(
        {
            "ok": False,
            "step": "import pyvips",
            "type": "ModuleNotFoundError",
            "message": "No module named '_libvips'",
            "outer": [
                {
                    "type": "OSError",
                    "message": "cannot load library 'libvips.so.42': libvips.so.42: cannot open shared object file",
                }
            ],
        }
    )
    assert failure is not None
    assert (failure.kind, failure.library) == ("missing-library", "libvips.so.42")
    assert failure.outer == (
        "OSError: cannot load library 'libvips.so.42': libvips.so.42: cannot open shared object file",
    )


def test_a_missing_module_with_no_failing_fallback_stays_an_undeclared_dependency() -> None:
    failure = _record(
        {
            "ok": False,
            "step": "import optpkg",
            "type": "ModuleNotFoundError",
            "message": "No module named 'absentdep'",
            "outer": [{"type": "ImportError", "message": "optpkg needs absentdep"}],
        }
    )
    assert failure is not None
    assert (failure.kind, failure.library) == ("missing-dependency", "absentdep")


def test_a_missing_cuda_library_of_another_major_is_a_cuda_major_mix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cudamajor, "env_cuda_major", lambda: 13)
    said = "libcudart.so.12: cannot open shared object file: No such file or directory"
    mix = _record({"ok": False, "step": "import tv", "type": "OSError", "message": said})
    assert mix is not None
    assert (mix.kind, mix.cause, mix.cuda_mix) == ("missing-library", "cuda-major-mix", {"library": 12, "env": 13})
    assert describe("tv", mix) == (
        "tv: missing shared library libcudart.so.12, a CUDA 12 library in a CUDA 13 environment (built for another "
        "CUDA major than torch's)"
    )
    same = _record({"ok": False, "step": "import tv", "type": "OSError", "message": said.replace(".12", ".13")})
    other = _record({"ok": False, "step": "import tv", "type": "OSError", "message": said.replace("cudart", "foo")})
    # cuRAND numbers its soname by its own release (libcurand.so.10 in CUDA 12 and 13 alike): no mix.
    curand = _record(
        {"ok": False, "step": "import tv", "type": "OSError", "message": said.replace("cudart.so.12", "curand.so.10")}
    )
    assert [(f.cause, f.cuda_mix) for f in (same, other, curand) if f is not None] == [
        ("missing-library", None),
        ("missing-library", None),
        ("missing-library", None),
    ]
    static = StageResult(
        name="static",
        state=StageState.FAIL,
        reason="x",
        details=StaticDetails(
            findings=(
                Finding(
                    severity=Severity.FAIL,
                    module="tv/_C.so",
                    kind=Kind.LIBRARY,
                    message="tv/_C.so needs libcudart.so.12",
                    details={"library": "libcudart.so.12", "torch_cuda": "13.0"},
                ),
            )
        ).to_details(),
    )
    assert blame.cause_of(static) == "cuda-major-mix"


def test_an_import_failure_a_file_clash_breaks_is_the_clashs_cause() -> None:
    broke = "pymongo: ImportError: cannot import name 'SON' from 'bson'"
    stages = (
        StageResult(
            name="pins",
            state=StageState.FAIL,
            reason="bson and pymongo both install 3 files (bson/, all code)",
            details={"file_clashes": [{"files": 3, "breaks": [broke]}]},
        ),
        StageResult(
            name="import",
            state=StageState.FAIL,
            reason=broke,
            cause="import-error",
            details={
                "causes": [
                    {"cause": "import-error", "reason": broke},
                    {"cause": "import-error", "reason": "other: ImportError: x"},
                ]
            },
        ),
    )
    assert [(b.stage, b.code, b.reason) for b in blame.blames(stages)] == [
        ("pins", "file-clash", stages[0].reason),
        ("import", "import-error", "other: ImportError: x"),
    ]
