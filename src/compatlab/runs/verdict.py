"""The verdict policy: a cell's state and reason from its stages, and which stage explains its colour.

Decided once, by the runner when a cell ends (``runner.conclude``); the result records the culprit stage's
name (``CellResult.culprit``) and the renderers read it from there (``culprit``).

- state: ``cell_state`` (runs/model.py): any fail is red, then any error is grey, then a required stage
  that did not run makes the cell amber, else green;
- culprit: the first stage of the state that decided it (the first fail of a red cell, the first error of
  a grey one, the first required skip of an amber one); a green cell has none;
- reason: the culprit's, as ``stage: reason``; an amber cell says what it proved and what did not run here
  (``amber_reason``); where the static stage's prediction and the import stage's proof differ, it says so.
"""

from __future__ import annotations

from collections.abc import Sequence

from compatlab.runs.model import CellResult, CellState, Expectation, StageResult, StageState, cell_state
from compatlab.runs.records.common import Notes
from compatlab.runs.records.suite import SuiteDetails

__all__ = ["amber_reason", "culprit", "explains", "is_unexpected", "verdict"]

# Which stage state decides each cell state, and whether only a required stage counts.
_DECIDES: dict[CellState, tuple[StageState, bool]] = {
    CellState.FAIL: (StageState.FAIL, False),
    CellState.ERROR: (StageState.ERROR, False),
    CellState.PARTIAL: (StageState.SKIP, True),
}


def explains(stages: Sequence[StageResult]) -> StageResult | None:
    """The stage that explains the colour ``cell_state(stages)`` gives: the first one of the deciding state."""
    decided = _DECIDES.get(cell_state(stages))
    if decided is None:
        return None
    wanted, required_only = decided
    return next((s for s in stages if s.state == wanted and (s.required or not required_only)), None)


def culprit(cell: CellResult) -> StageResult | None:
    """The stage that explains *cell*'s colour, as its result records it; a record written before the lab
    recorded one gets the same policy applied to its stages."""
    return cell.stage(cell.culprit) if cell.culprit else explains(cell.stages)


def verdict(stages: tuple[StageResult, ...]) -> tuple[CellState, str, StageResult | None]:
    """The cell's state from its stages, its reason and its culprit stage: the first stage that decided it,
    and where the static stage's prediction and the import stage's proof differ, that they do."""
    state = cell_state(stages)
    bad = explains(stages)
    if state == CellState.PARTIAL:
        return state, amber_reason(stages), bad
    reason = f"{bad.name}: {bad.reason}" if bad is not None else ""
    return state, reason + _disagreement(stages), bad


def amber_reason(stages: Sequence[StageResult]) -> str:
    """A partial cell's reason: what it proved (the stages that ran, with the import stage's count and the
    warnings) and what did not run here and why, so that two amber cells read alike only when they are:
    ``ran install, pins, static, import (412/412 modules load; 3 warnings); not run here: cuda, serve — no
    NVIDIA driver on this machine (no libcuda.so.1)``."""
    ran: list[str] = []
    warnings = 0
    for s in stages:
        if s.state not in (StageState.PASS, StageState.WARN):
            continue
        ran.append(s.name)
        warnings += len(Notes.of(s).warnings) if s.state == StageState.WARN else 0
        counted = SuiteDetails.of(s) if s.name == "import" else None
        if counted is not None and counted.loaded is not None and counted.total is not None:
            ran[-1] += f" ({counted.loaded}/{counted.total} modules load)"
    groups: list[tuple[list[str], str]] = []
    for s in stages:
        if s.state != StageState.SKIP or not s.required:
            continue
        if groups and s.reason.startswith("blocked: "):
            groups[-1][0].append(s.name)  # blocked by what the group before says
        elif groups and s.reason == groups[-1][1]:
            groups[-1][0].append(s.name)
        else:
            groups.append(([s.name], s.reason))
    proved = "ran " + ", ".join(ran) if ran else "nothing ran"
    if warnings:
        proved += f"; {warnings} warning{'s' if warnings != 1 else ''}"
    missing = "; ".join(f"{', '.join(names)} — {why.removeprefix('not run: ')}" for names, why in groups)
    return f"{proved}; not run here: {missing}" if missing else proved


_LINK_CAUSES = ("abi-symbol", "torch-abi", "python-abi", "symbol-version", "missing-library", "")


def _disagreement(stages: tuple[StageResult, ...]) -> str:
    """The static stage predicts what the import stage proves; when they differ, the reason says so."""
    by_name = {s.name: s for s in stages}
    static, imported = by_name.get("static"), by_name.get("import")
    if static is None or imported is None or {static.state, imported.state} != {StageState.FAIL, StageState.PASS}:
        return ""
    if imported.state == StageState.FAIL and imported.cause not in _LINK_CAUSES:
        return ""  # an exception of Python code, which static never reads: no prediction to disagree with
    if static.state == StageState.FAIL:
        return " [import disagrees: every module loaded]"
    return " [static disagrees: it predicted no load failure]"


def is_unexpected(state: CellState, expected: Expectation | None, *, preflight: bool = False) -> bool:
    """News for the nightly job: a red cell nobody expected, a known-bad cell that passed, or an error. A
    preflight judges only the stages it ran: a known-bad cell it left partial was not reached, no news."""
    if state == CellState.NA:
        return False
    if state == CellState.ERROR:
        return True
    if expected is not None and expected.state == CellState.FAIL:
        return state == CellState.PASS or (state == CellState.PARTIAL and not preflight)
    return state == CellState.FAIL
