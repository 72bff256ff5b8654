"""Answers above the grid: the newest working stack with its install command, every red cell's nearest
working neighbour, and the "shipped together" and "forced" marks, in HTML, Markdown and answers.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from compatlab.render import render_run
from compatlab.render._grid import run_from_json
from compatlab.render.answers import answers
from compatlab.runs.model import CellState, InstallRecord

PY = ".venvs/c/bin/python"


def cell(
    sglang: str,
    torch: str,
    kernel: str,
    state: str,
    *,
    cuda: str = "13.0",
    why: str = "",
    stage: str = "import",
    shipped: str = "",
    conflicts: list[str] | None = None,
) -> dict[str, Any]:
    axes = {"sglang": sglang, "torch": torch, "sglang-kernel": kernel, "cuda": cuda}
    cid = f"sglang{sglang}-torch{torch}-sglangkernel{kernel}-cuda{cuda}"
    stages: list[dict[str, Any]] = [{"name": "install", "state": "pass"}]
    if state == "fail":
        stages.append({"name": stage, "state": "fail", "reason": why})
    elif state == "partial":
        stages.append({"name": "cuda", "state": "skip", "reason": "no GPU", "required": True})
    install: dict[str, Any] = {"argv": ["uv", "pip", "install", "--python", PY, f"torch=={torch}"], "forced": True}
    if shipped:
        install["shipped"] = shipped
    if conflicts is not None:
        install["conflicts"] = conflicts
    return {
        "id": cid,
        "axes": axes,
        "state": state,
        "stages": stages,
        "install": install,
        "reason": f"{stage}: {why}" if why else "",
    }


def run_json(cells: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "schema": "compatlab.results/1",
        "run": {
            "id": "r1",
            "started": "2026-12-02T10:15:00+00:00",
            "matrix_name": "living",
            "report": {"rows": ["torch"], "columns": ["sglang", "sglang-kernel"], "tables": ["cuda"]},
            "axes": {
                "sglang": ["0.5.22", "0.5.23"],
                "torch": ["2.10.0", "2.14.1", "2.15.0"],
                "sglang-kernel": ["0.4.9", "0.4.10"],
                "cuda": ["12.8", "13.0", "13.2"],
            },
        },
        "cells": cells,
    }


UNDEFINED = "sgl_kernel/common_ops.abi3.so: undefined symbol c10::cuda::foo(unsigned int)"
CELLS = [
    cell("0.5.23", "2.14.1", "0.4.10", "partial", shipped="sglang 0.5.23", conflicts=[]),
    cell(
        "0.5.23",
        "2.15.0",
        "0.4.10",
        "fail",
        cuda="13.2",
        why=UNDEFINED,
        conflicts=["sglang 0.5.23 pins torch==2.14.1", "sglang-kernel 0.4.10 pins torch==2.14.1"],
    ),
    cell("0.5.23", "2.14.1", "0.4.9", "pass", conflicts=["sglang 0.5.23 pins sglang-kernel==0.4.10"]),
    cell("0.5.22", "2.14.1", "0.4.10", "pass", conflicts=["sglang 0.5.22 pins sglang-kernel==0.4.9"]),
    cell(
        "0.5.23",
        "2.10.0",
        "0.4.10",
        "fail",
        cuda="12.8",
        stage="static",
        why="libnvrtc.so.13 not found",
        conflicts=["sglang 0.5.23 pins torch==2.14.1"],
    ),
    cell("0.5.22", "2.15.0", "0.4.9", "fail", cuda="13.2", why="no kernel image"),
]


def test_the_newest_working_stack_and_each_red_cells_nearest_neighbour() -> None:
    found = answers(run_from_json(run_json(CELLS), "results.json"))
    assert found.newest is not None
    # sglang 0.5.23 first, then the newest torch that works with it, then the newest kernel: the amber shipped
    # stack beats the green one with the older sglang-kernel.
    assert found.newest.id == "sglang0.5.23-torch2.14.1-sglangkernel0.4.10-cuda13.0"
    assert found.command == f"uv pip install --python {PY} torch==2.14.1"
    assert [n.sentence for n in found.neighbours] == [
        f"torch 2.15.0 fails at import ({UNDEFINED}) with sglang 0.5.23 · sglang-kernel 0.4.10; torch 2.14.1 "
        "passes what ran here (partial: no GPU stage ran)",
        "torch 2.10.0 fails at static (libnvrtc.so.13 not found) with sglang 0.5.23 · sglang-kernel 0.4.10; "
        "torch 2.14.1 passes what ran here (partial: no GPU stage ran)",
        "sglang 0.5.22 · torch 2.15.0 · sglang-kernel 0.4.9 · cuda 13.2: no working cell one axis away",
    ]


def test_answers_and_marks_in_html_markdown_and_json(tmp_path: Path) -> None:
    src = tmp_path / "in" / "results.json"
    src.parent.mkdir()
    src.write_text(json.dumps(run_json(CELLS)))
    render_run(src, tmp_path / "out", history_dir=None)
    md = (tmp_path / "out" / "compat.md").read_text()
    assert md.split("## Answers\n\n", 1)[1].split("\n## CUDA", 1)[0] == (
        "**Newest working stack** (amber: no GPU stage ran here): sglang 0.5.23 · torch 2.14.1 · sglang-kernel "
        "0.4.10 · cuda 13.0 *(shipped together)*\n\n"
        f"```sh\nuv pip install --python {PY} torch==2.14.1\n```\n\n"
        "**Each red cell's nearest working neighbour** (one axis changed):\n\n"
        "- torch 2.15.0 fails at import (sgl\\_kernel/common\\_ops.abi3.so: undefined symbol c10::cuda::foo(unsigned "
        "int)) with sglang 0.5.23 · sglang-kernel 0.4.10; torch 2.14.1 passes what ran here (partial: no GPU stage ran)\n"
        "- torch 2.10.0 fails at static (libnvrtc.so.13 not found) with sglang 0.5.23 · sglang-kernel 0.4.10; "
        "torch 2.14.1 passes what ran here (partial: no GPU stage ran)\n"
        "- sglang 0.5.22 · torch 2.15.0 · sglang-kernel 0.4.9 · cuda 13.2: no working cell one axis away\n"
    )
    # In the grid: the shipped stack is marked, forced cells that broke a pin are, the others not.
    assert "◐ partial *(shipped together)*" in md
    assert md.count("*(forced)*") == 5  # four broke a pin, and one whose pins the lock did not know
    html = (tmp_path / "out" / "index.html").read_text()
    answers_html = html.split('<section class="answers">', 1)[1].split("</section>", 1)[0]
    assert (
        '<span class="tag shipped" title="sglang 0.5.23&#x27;s own pinned stack">shipped together</span>'
        in answers_html
    )
    assert (f"<pre>uv pip install --python {PY} torch==2.14.1</pre>") in answers_html
    assert (
        html.count(
            '<span class="tag forced" title="installed with the axis pins as overrides: sglang 0.5.23 pins '
            'torch==2.14.1; sglang-kernel 0.4.10 pins torch==2.14.1">forced</span>'
        )
        == 1
    )
    data = json.loads((tmp_path / "out" / "answers.json").read_text())
    assert data["newest"] == {
        "id": "sglang0.5.23-torch2.14.1-sglangkernel0.4.10-cuda13.0",
        "axes": {"sglang": "0.5.23", "torch": "2.14.1", "sglang-kernel": "0.4.10", "cuda": "13.0"},
        "state": "partial",
        "shipped": "sglang 0.5.23",
        "forced": False,
        "command": f"uv pip install --python {PY} torch==2.14.1",
        "breaks": [],
    }
    assert [(n["red"]["id"], n["green"] and n["green"]["id"], n["axis"]) for n in data["neighbours"]] == [
        (
            "sglang0.5.23-torch2.15.0-sglangkernel0.4.10-cuda13.2",
            "sglang0.5.23-torch2.14.1-sglangkernel0.4.10-cuda13.0",
            "torch",
        ),
        (
            "sglang0.5.23-torch2.10.0-sglangkernel0.4.10-cuda12.8",
            "sglang0.5.23-torch2.14.1-sglangkernel0.4.10-cuda13.0",
            "torch",
        ),
        ("sglang0.5.22-torch2.15.0-sglangkernel0.4.9-cuda13.2", None, ""),
    ]


def test_no_working_cell_says_so() -> None:
    found = answers(run_from_json(run_json([CELLS[1]]), "results.json"))
    assert (found.newest, found.command) == (None, None)


def test_the_answer_is_a_command_for_the_users_own_venv() -> None:
    from compatlab.render.answers import portable_command
    from compatlab.runs.model import CellResult

    cell = CellResult(
        id="c",
        axes={"torch": "2.14.1"},
        state=CellState.PARTIAL,
        install=InstallRecord.from_json(
            {
                "argv": ["/abs/uv", "pip", "install", "--python", "/abs/venvs/run/c/bin/python", "-r", "/abs/spec"],
                "requirements": ["sglang==0.5.23", "torch==2.14.1"],
                "overrides": ["torch==2.14.1"],
            }
        ),
    )
    assert portable_command(cell) == (
        "printf '%s\\n' torch==2.14.1 > overrides.txt && uv pip install sglang==0.5.23 torch==2.14.1 "
        "--override overrides.txt"
    )


def test_a_stack_that_installs_without_force_wins_and_a_forced_answer_names_the_pins_it_breaks(tmp_path: Path) -> None:
    forced = cell(
        "0.5.23",
        "2.15.0",
        "0.4.10",
        "pass",
        cuda="13.2",
        conflicts=["sglang 0.5.23 pins torch==2.14.1", "sglang-kernel 0.4.10 pins torch==2.14.1"],
    )
    forced["stages"].insert(
        1,
        {
            "name": "pins",
            "state": "warn",
            "details": {
                "broken_requirements": [
                    {
                        "by": "sglang",
                        "requires": "torch==2.14.1",
                        "package": "torch",
                        "installed": "2.15.0",
                        "text": "sglang 0.5.23 requires torch==2.14.1; torch 2.15.0 is installed",
                    }
                ]
            },
        },
    )
    unforced = cell("0.5.22", "2.14.1", "0.4.9", "partial", shipped="sglang 0.5.22", conflicts=[])
    found = answers(run_from_json(run_json([forced, unforced]), "results.json"))
    assert found.newest is not None
    assert (found.newest.id, found.breaks) == ("sglang0.5.22-torch2.14.1-sglangkernel0.4.9-cuda13.0", ())
    alone = tmp_path / "in" / "results.json"
    alone.parent.mkdir()
    alone.write_text(json.dumps(run_json([forced])))
    found = answers(run_from_json(run_json([forced]), "results.json"))
    assert found.breaks == ("sglang 0.5.23 requires torch==2.14.1; torch 2.15.0 is installed",)
    render_run(alone, tmp_path / "out", history_dir=None)
    md = (tmp_path / "out" / "compat.md").read_text()
    assert (
        "**Newest working stack** (green): sglang 0.5.23 · torch 2.15.0 · sglang-kernel 0.4.10 · cuda 13.2 "
        "*(forced)*\n\nNo working stack installs without force: this one breaks sglang 0.5.23 requires "
        "torch==2.14.1; torch 2.15.0 is installed.\n"
    ) in md
    html = (tmp_path / "out" / "index.html").read_text()
    assert (
        "<p>No working stack installs without force: this one breaks sglang 0.5.23 requires torch==2.14.1; "
        "torch 2.15.0 is installed.</p>"
    ) in html
