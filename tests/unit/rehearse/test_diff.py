"""rehearse.diff on stage results as check writes them, and the screen render/rehearsal.py makes of them."""

from __future__ import annotations

from typing import Any

from compatlab.rehearse.diff import broken_pins, diff_modules, module_verdicts
from compatlab.render.rehearsal import rehearsal_lines
from compatlab.runs.model import CellResult, CellState, StageResult, StageState
from compatlab.runs.records.pins import BrokenRequirement, PinsDetails
from compatlab.runs.records.static import Finding, Kind, Severity, StaticDetails
from compatlab.runs.rehearsal import Attempt, Change, Install, Judged, ModuleChange, ModuleState, Outcome, Rehearsal

BROKEN_PIN = "sglang 0.5.23 requires torch==2.9.1; torch 2.10.0 is installed"


def _cell(modules: list[dict[str, Any]], *, broken: list[str] = (), findings: tuple[Finding, ...] = ()) -> CellResult:  # type: ignore[assignment]
    pins = {"broken_requirements": [{"text": t} for t in broken]}
    static = StaticDetails(modules_by_dist={"k": ("k/_ops.so", "k/_jit.so")}, findings=findings)
    return CellResult(
        id="c",
        axes={},
        state=CellState.PARTIAL,
        stages=(
            StageResult(name="pins", state=StageState.PASS, details=pins),
            StageResult(name="static", state=StageState.PASS, details=static.to_details()),
            StageResult(name="import", state=StageState.PASS, details={"modules": modules}),
        ),
    )


def test_a_module_that_worked_and_fails_is_a_break_with_both_stages_words() -> None:
    before = _cell(
        [
            {"module": "k/_ops.so", "dist": "k", "ok": True},
            {"module": "k", "dist": "k", "ok": True},
            {"module": "v", "dist": "v", "ok": False, "reason": "v: no module named x"},
            {"module": "k/_opt.so", "dist": "k", "ok": False, "needed": False, "verdict": "k/_opt.so: lazily"},
        ]
    )
    after = _cell(
        [
            {
                "module": "k/_ops.so",
                "dist": "k",
                "ok": False,
                "reason": "k/_ops.so: undefined symbol f(int)",
                "cause": "torch-abi",
            },
            {"module": "k", "dist": "k", "ok": True},
            {"module": "v", "dist": "v", "ok": True},
            {"module": "n", "dist": "n", "ok": False, "reason": "n: ImportError: boom"},
        ],
        broken=[BROKEN_PIN],
        findings=(
            Finding(
                severity=Severity.FAIL,
                module="k/_ops.so",
                kind=Kind.SYMBOL,
                message="k/_ops.so needs f(int); torch 2.10.0 exports f(unsigned int): k was built against another torch.",
                details={"dist": "k"},
            ),
        ),
    )
    assert module_verdicts(before)["k/_opt.so"][0] == ModuleState.WARN
    assert module_verdicts(before)["k/_jit.so"] == (ModuleState.PASS, "k", "", "")  # static's module, no import entry
    breaks, fixes, new_broken, gone = diff_modules(before, after)
    assert [(m.module, m.cause, m.code) for m in breaks] == [
        ("k/_ops.so", "undefined symbol f(int); torch 2.10.0 exports f(unsigned int): k was built against another torch.",
         "torch-abi"),
    ]  # fmt: skip
    assert [(m.module, m.cause) for m in fixes] == [("v", "v: no module named x")]
    assert [m.module for m in new_broken] == ["n"]
    assert [m.module for m in gone] == ["k/_opt.so"]
    assert broken_pins(before, after) == [BROKEN_PIN]
    assert broken_pins(after, after) == []


def test_the_screen_names_each_pin_the_install_breaks_and_says_when_nothing_safer_was_found() -> None:
    judged = Judged(state="fail", reason="", report="/o/after", seconds=1.0)
    request = Attempt(
        label="the install as typed",
        command=("uv", "pip", "install", "--python", "/e/bin/python", "--no-deps", "torch==2.10.0"),
        install=Install(ok=True),
        outcome=Outcome.BREAKS,
        changes=(Change(name="torch", old="2.9.1+cu130", new="2.10.0", old_cuda="13.0", new_cuda="12.8"),),
        broken_pins=(BROKEN_PIN,),
        breaks=(
            ModuleChange(
                module="sglang", dist="sglang", before=ModuleState.PASS, after=ModuleState.FAIL, cause="ImportError: x"
            ),
        ),
        judged=judged,
    )
    held = Attempt(
        label="the newest release of x that accepts the installed torch (2.9.1+cu130)",
        command=(),
        install=Install(ok=False, reason="unsatisfiable: x 2.0 requires torch>=2.10"),
        outcome=Outcome.INSTALL_FAILS,
    )
    r = Rehearsal(
        id="r",
        environment="/e",
        python="3.11.7",
        started="",
        seconds=3.0,
        original=Judged(state="partial", reason="", report="/o/original", seconds=1.0),
        request=request,
        safer=(held,),
    )
    assert rehearsal_lines(r)[2:] == [
        "the install changes 1 distribution:",
        "  torch 2.9.1+cu130 → 2.10.0 (build +cu130 → generic; CUDA 13.0 → 12.8)",
        "pins it breaks (1):",
        f"  {BROKEN_PIN}",
        "what worked and breaks (1):",
        "  sglang: ImportError: x",
        "what was broken and is fixed: none",
        "verdict: breaks: 1 module that works now breaks (after: fail)",
        "tried on its own copy: the newest release of x that accepts the installed torch (2.9.1+cu130): the install "
        "fails: unsatisfiable: x 2.0 requires torch>=2.10; the environment would stay as it is",
        "safer command: none found that keeps what works (none is suggested without being judged)",
        "time: 3.0 s (judging the environment as it is: 1.0 s)",
    ]


def _predicted(*findings: Finding, pins: PinsDetails | None = None) -> CellResult:
    """A check without an import stage: static's prediction is each module's verdict."""
    static = StaticDetails(modules_by_dist={"k": ("k/_ops.so", "k/_jit.so"), "v": ("v/_v.so",)}, findings=findings)
    stages = [
        StageResult(name="static", state=StageState.FAIL if findings else StageState.PASS, details=static.to_details())
    ]
    if pins is not None:
        stages.append(StageResult(name="pins", state=StageState.FAIL, details=pins.to_details()))
    return CellResult(id="c", axes={}, state=CellState.PARTIAL, stages=tuple(stages))


def test_without_an_import_stage_static_s_failures_are_the_verdicts_and_its_notes_are_not() -> None:
    missing = Finding(
        severity=Severity.FAIL,
        module="k/_ops.so",
        kind=Kind.LIBRARY,
        message="k/_ops.so needs libcudart.so.12: not in site-packages nor in the system's library cache",
        details={"dist": "k", "library": "libcudart.so.12"},
    )
    note = Finding(severity=Severity.NOTE, module="k/_jit.so", kind=Kind.ARCH, message="k/_jit.so: no sm_120 code")
    unowned = Finding(severity=Severity.FAIL, module="x.so", kind=Kind.SYMBOL, message="x.so needs f()")
    metadata = Finding(severity=Severity.FAIL, module="", kind=Kind.METADATA, message="a METADATA file is unreadable")
    before, after = _predicted(), _predicted(missing, note, unowned, metadata)
    assert module_verdicts(after) == {
        "k/_ops.so": (ModuleState.FAIL, "k", f"static: {missing.message}", ""),
        "k/_jit.so": (ModuleState.PASS, "k", "", ""),
        "v/_v.so": (ModuleState.PASS, "v", "", ""),
        "x.so": (ModuleState.FAIL, "", "static: x.so needs f()", ""),
    }
    breaks, fixes, new_broken, gone = diff_modules(before, after)
    assert [(m.module, m.dist, m.before, m.after, m.cause) for m in breaks] == [
        ("k/_ops.so", "k", ModuleState.PASS, ModuleState.FAIL, f"static: {missing.message}")
    ]
    assert [(m.module, m.cause) for m in new_broken] == [("x.so", "static: x.so needs f()")]
    assert (fixes, gone) == ([], [])
    assert [(m.module, m.cause) for m in diff_modules(after, before)[1]] == [
        ("k/_ops.so", f"static: {missing.message}")
    ]


def test_the_pins_it_breaks_are_read_from_the_pins_record() -> None:
    broken = BrokenRequirement(
        by="sglang", requires="torch==2.9.1", package="torch", installed="2.10.0", text=BROKEN_PIN
    )
    before = _predicted(pins=PinsDetails())
    after = _predicted(pins=PinsDetails(broken_requirements=(broken,)))
    assert broken_pins(before, after) == [BROKEN_PIN]
    assert broken_pins(after, before) == []
    assert broken_pins(_predicted(), after) == [BROKEN_PIN]  # no pins stage before: nothing was broken
