"""The typed stage records (runs/records/) over real stored results: tests/fixtures/records/ holds three cells
of the truth corpus and the bench matrix as the lab wrote them (pymongo beside bson: a file clash the import
stage proves; pydantic beside an older pydantic-core: a broken pin; an unsatisfiable install). Each record reads
its stage's details and writes them back byte for byte, and the stage code that builds them (the observed clash,
the blamed pin, the perf report) writes the same bytes as the stored result."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from compatlab.runs.model import CellResult, StageResult, StageState
from compatlab.runs.records.common import Notes
from compatlab.runs.records.figures import Figure, figures_of
from compatlab.runs.records.install import InstallDetails
from compatlab.runs.records.perf import PerfDetails
from compatlab.runs.records.pins import PinsDetails
from compatlab.runs.records.serve import ServeDetails
from compatlab.runs.records.suite import SuiteDetails
from compatlab.stages.perf.stage import PerfReport, Verdict
from compatlab.stages.runtime import blame_broken_pins, observed_clashes

RECORDS = Path(__file__).resolve().parents[2] / "fixtures" / "records"


def cell(name: str) -> CellResult:
    data = json.loads((RECORDS / f"{name}.json").read_text(encoding="utf-8"))
    data.pop("schema")
    return CellResult.from_json(data)


def stage(name: str, of: str) -> StageResult:
    found = cell(name).stage(of)
    assert found is not None
    return found


def same_bytes(a: object, b: object) -> bool:
    return json.dumps(a, indent=2) == json.dumps(b, indent=2)


@pytest.mark.parametrize(
    ("name", "of", "record"),
    [
        ("pymongo-and-bson", "pins", PinsDetails),
        ("pymongo-and-bson", "import", SuiteDetails),
        ("pymongo-and-bson", "cuda", SuiteDetails),
        ("pydantic-core-mismatch", "pins", PinsDetails),
        ("pydantic-core-mismatch", "import", SuiteDetails),
        ("unsatisfiable-install", "install", InstallDetails),
    ],
)
def test_a_stored_stage_reads_back_and_writes_the_same_bytes(name: str, of: str, record: type[PinsDetails]) -> None:
    result = stage(name, of)
    assert result.details
    assert same_bytes(record.of(result).to_details(), result.details)


def test_the_pins_record_types_what_the_readers_read() -> None:
    pins = PinsDetails.of(stage("pydantic-core-mismatch", "pins"))
    assert [b.text for b in pins.broken_requirements] == [
        "pydantic 2.12.5 requires pydantic-core==2.41.5; pydantic-core 2.33.2 is installed"
    ]
    assert pins.broken_requirements[0].by == "pydantic"
    assert pins.warnings == (pins.broken_requirements[0].text,)
    assert (pins.torch_cuda, pins.cell_cuda, pins.cuda_packages) == (None, None, None)
    clash = PinsDetails.of(stage("pymongo-and-bson", "pins")).file_clashes[0]
    assert (clash.owners, clash.fails, clash.examples[0]) == (
        ("bson 0.5.10", "pymongo 4.10.1"),
        True,
        "bson/__init__.py",
    )


def test_the_observed_clash_is_the_stored_one() -> None:
    """The pins stage's clash as the pins stage said it, then what the import stage saw: the stored result."""
    stored = stage("pymongo-and-bson", "pins")
    found = PinsDetails.of(stored)
    said = found.file_clashes[0].text.partition("; it breaks ")[0]
    before = dataclasses.replace(
        found,
        file_clashes=(dataclasses.replace(found.file_clashes[0], text=said, breaks=None),),
        failures=(said,),
    )
    pins = dataclasses.replace(stored, reason=said, cause="", details=before.to_details())
    observed = observed_clashes((pins, stage("pymongo-and-bson", "import")))[0]
    assert observed.reason == stored.reason
    assert same_bytes(observed.details, stored.details)


def test_the_blamed_pin_is_the_stored_one() -> None:
    """The import stage's failure before blame_broken_pins named the pin, then after: the stored result."""
    stored = stage("pydantic-core-mismatch", "import")
    raw = {k: v for k, v in stored.details.items() if k != "broken_pins"}
    first = stored.reason.partition("; pydantic 2.12.5 requires")[0]
    failed = dataclasses.replace(stored, reason=first, cause="import-error", details=raw)
    blamed = blame_broken_pins(failed, stage("pydantic-core-mismatch", "pins"))
    assert (blamed.reason, blamed.cause) == (stored.reason, "pin-broken")
    assert same_bytes(blamed.details, stored.details)
    assert SuiteDetails.of(blamed).broken_pins == (
        "pydantic 2.12.5 requires pydantic-core==2.41.5; pydantic-core 2.33.2 is installed",
    )


def test_the_suite_record_reads_the_import_stages_entries_and_counts() -> None:
    imported = SuiteDetails.of(stage("pymongo-and-bson", "import"))
    entries = imported.entries()
    assert (imported.loaded, imported.total) == (14, 16) == (sum(e.ok for e in entries), len(entries))
    assert {e.module for e in entries if not e.ok} >= {"gridfs", "pymongo"}
    assert Notes.of(stage("pymongo-and-bson", "import")).failures == imported.failures


def test_the_install_record_says_the_attempts() -> None:
    install = InstallDetails.of(stage("unsatisfiable-install", "install"))
    assert (install.attempts, install.argv[1:3]) == (1, ("pip", "install"))
    made = InstallDetails(argv=("uv", "venv"), stderr="no python").to_details()
    assert made == {"argv": ["uv", "venv"], "stderr": "no python"}  # the venv was not made: no stdout, no uv time


def test_the_perf_report_writes_its_record() -> None:
    verdicts = {"1": {"verdict": Verdict.INCONCLUSIVE, "spread": 0.2, "noisy": True, "checks": [{"check": "speedup"}]}}
    report = PerfReport(
        state=StageState.FAIL,
        verdict=Verdict.INCONCLUSIVE,
        reason="EAGLE-3 …",
        figures={"speedup_c1": 1.4, "eagle3_tok_s_c1": 96.0},
        verdicts=verdicts,
        trials=[{"server": "eagle3", "trial": 1, "log_tail": "ready", "levels": {"1": {"tok_s": 96.0}}}],
    )
    result = report.stage_result()
    perf = PerfDetails.of(result)
    assert (perf.verdict, perf.rerun, perf.verdicts["1"].noisy, perf.logs) == (
        "inconclusive",
        True,
        True,
        {"eagle3-trial1": "ready"},
    )
    assert same_bytes(perf.to_details(), result.details)
    assert [(f.name, f.value, f.rank) for f in figures_of(result)] == [
        ("speedup_c1", 1.4, 1),
        ("eagle3_tok_s_c1", 96.0, 2),
    ]


def test_figures_leave_out_what_is_not_a_finite_number() -> None:
    nccl = StageResult(name="nccl", state=StageState.PASS, details={"busbw_gbps": 41.5, "figures": {"x": True}})
    serve = StageResult(name="serve", state=StageState.PASS, details={"figures": {"a_tok_s_c1": 80, "b": "n/a"}})
    assert figures_of(nccl) == (Figure(name="busbw_gbps", value=41.5),)
    assert figures_of(serve) == (Figure(name="a_tok_s_c1", value=80.0),)


def test_the_serve_record_keeps_the_stages_order_and_leaves_out_what_it_did_not_reach() -> None:
    skipped = ServeDetails(sglang="0.5.23").to_details()
    assert skipped == {"sglang": "0.5.23"}
    served = ServeDetails(
        sglang="0.5.23",
        gpus=({"index": 0, "arch": "sm_90"},),
        tp=1,
        notes=(),
        servers={"baseline": {"tok_s_c1": 80.0}, "eagle3": {"state": StageState.SKIP, "reason": "not started"}},
        weights="random",
        figures={"baseline_tok_s_c1": 80.0},
    )
    details = served.to_details()
    assert list(details) == ["sglang", "gpus", "tp", "notes", "servers", "weights", "figures"]
    back = ServeDetails.of(StageResult(name="serve", state=StageState.PASS, details=json.loads(json.dumps(details))))
    assert list(back.served) == ["baseline"]
    assert same_bytes(back.to_details(), details)
