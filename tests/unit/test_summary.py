"""The summary table a run ends with: a row per cell that ran, one per reason for the n/a ones."""

from __future__ import annotations

from compatlab.cli.runs import summary_table
from compatlab.runs.model import CellResult, CellState, Results, RunInfo

BUILT_FOR_13 = "torch 2.9.1+cu130 is built for CUDA 13.0, this column is CUDA 12.8"
BUILT_FOR_12 = "torch 2.9.1+cu128 is built for CUDA 12.8, this column is CUDA 13.0"


def test_not_applicable_cells_are_one_line_per_reason() -> None:
    def na(cid: str, why: str) -> CellResult:
        return CellResult(id=cid, axes={}, state=CellState.NA, reason=why)

    cells = (
        CellResult(
            id="torch2.9.1+cu130-cuda13.0",
            axes={},
            state=CellState.PARTIAL,
            seconds=12.34,
            reason="cuda: no NVIDIA driver on this machine (no libcuda.so.1)",
        ),
        na("torch2.9.1+cu130-flashinfer0.6.4-cuda12.8", BUILT_FOR_13),
        na("torch2.9.1+cu130-flashinfer0.7.4-cuda12.8", BUILT_FOR_13),
        na("torch2.9.1+cu128-flashinfer0.6.4-cuda13.0", BUILT_FOR_12),
    )
    text, unexpected = summary_table(Results(run=RunInfo(id="r1"), cells=cells))
    assert unexpected == 0
    assert text.splitlines() == [
        "cell                                       state    seconds  reason",
        "torch2.9.1+cu130-cuda13.0                  partial  12.3     cuda: no NVIDIA driver on this machine (no libcuda.so.1)",
        f"2 cells                                    n/a               {BUILT_FOR_13}",
        f"torch2.9.1+cu128-flashinfer0.6.4-cuda13.0  n/a               {BUILT_FOR_12}",
        "",
        "totals: n/a 3, partial 1; unexpected 0",
    ]
