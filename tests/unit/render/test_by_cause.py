"""The red cells grouped by cause on the page, as compat.md groups them: one line per code of incell/causes.py, most
frequent first, naming the cells (a cell with two causes is under both)."""

from __future__ import annotations

from typing import Any

from compatlab.render._grid import run_from_json
from compatlab.render.html import render_html
from compatlab.render.view import build


def red(torch: str, *causes: tuple[str, str, str]) -> dict[str, Any]:
    first = causes[0]
    return {
        "id": f"torch{torch}",
        "axes": {"torch": torch},
        "state": "fail",
        "stages": [{"name": "install", "state": "pass"}, {"name": first[0], "state": "fail", "reason": first[2]}],
        "reason": f"{first[0]}: {first[2]}",
        "causes": [{"stage": s, "code": c, "reason": r} for s, c, r in causes],
    }


RUN: dict[str, Any] = {
    "schema": "compatlab.results/1",
    "run": {"id": "r1", "started": "2026-12-02T10:15:00+00:00", "matrix_name": "m", "axes": {"torch": ["2.9", "2.10"]}},
    "cells": [
        red("2.9", ("import", "torch-abi", "undefined symbol c10::foo")),
        red("2.10", ("pins", "file-clash", "a and b both install x"), ("import", "torch-abi", "undefined symbol")),
        {"id": "torch2.11", "axes": {"torch": "2.11"}, "state": "pass", "stages": []},
    ],
}


def test_the_page_groups_red_cells_by_cause() -> None:
    page = render_html(build(run_from_json(RUN, "results.json")))
    assert (
        '<section class="causes"><h2 id="causes">Red cells by cause</h2><ul>'
        "<li><b>torch-abi</b> (built for another torch (a C++ symbol of torch is missing)): 2 cells: "
        '<a href="#c-torch2.9">torch 2.9</a>, <a href="#c-torch2.10">torch 2.10</a></li>'
        "<li><b>file-clash</b> (two distributions install the same file with different bytes): 1 cell: "
        '<a href="#c-torch2.10">torch 2.10</a></li></ul></section>'
    ) in page
    green = {**RUN, "cells": RUN["cells"][2:]}
    assert "Red cells by cause" not in render_html(build(run_from_json(green, "results.json")))
