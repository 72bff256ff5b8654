"""Defence in depth at render time: no URL credential and no hidden character reaches a page.

The lab keeps credentials out of its results (tests/unit/test_envs.py, tests/e2e/test_secrets.py); a
results file written before that, or by hand, must still not leak them into the grid, compat.md or the
published site, and text in a cell must not be able to reorder or hide what the grid says.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from compatlab.render import publish, render_run
from compatlab.render.markdown import md_code, md_text
from compatlab.render.text import printable
from compatlab.runs.model import SCHEMA, CellResult, CellState, InstallRecord, StageResult, StageState

PASSWORD = "hunter2"
LEAKY = f"https://bob:{PASSWORD}@pypi.corp.example/simple"
SHOWN = "https://***@pypi.corp.example/simple"
# "fail" written so that a bidi override makes it read as "pass" (Trojan Source, CVE-2021-42574).
SPOOF = "torch \u202eliaf\u202c ok"


def leaky_results() -> dict[str, Any]:
    axes = {"torch": "2.9.1", "sgl-kernel": "0.3.21", "flashinfer": "0.6.4", "cuda": "12.8"}
    cell = CellResult(
        id="torch2.9.1-sglkernel0.3.21-flashinfer0.6.4-cuda12.8",
        axes=axes,
        state=CellState.ERROR,
        reason=f"install: index or network failure: Failed to fetch: {LEAKY}/torch/",
        stages=(
            StageResult(
                name="install",
                state=StageState.ERROR,
                reason=f"Failed to fetch: {LEAKY}/torch/ {SPOOF}",
                details={
                    "argv": ["uv", "pip", "install", "--index-url", LEAKY],
                    "stderr": f"error: Failed to fetch: {LEAKY}/torch/\n\x1b[31mred\x1b[0m\tTab\u2066hidden\u2069",
                },
            ),
        ),
        install=InstallRecord.from_json(
            {
                "argv": ["uv", "pip", "install", "--index-url", LEAKY],
                "files": {"pyproject.toml": f'[[tool.uv.index]]\nname = "index-1"\nurl = "{LEAKY}"\n'},
            }
        ),
        freeze=(
            f"torch @ {LEAKY}/torch-2.9.1-py3-none-any.whl",
            "sgl-kernel==0.3.21\u200f",
        ),
        started="2026-12-02T10:16:00+00:00",
        finished="2026-12-02T10:17:00+00:00",
    )
    return {
        "schema": SCHEMA,
        "run": {
            "id": "20261202T101500Z-ab12",
            "started": "2026-12-02T10:15:00+00:00",
            "finished": "2026-12-02T10:17:00+00:00",
            "host": {"hostname": "gpubox\u202e-7"},
            "matrix": "matrix.toml",
            "matrix_name": "default",
            "report": {"rows": ["torch"], "columns": ["sgl-kernel", "flashinfer"], "tables": ["cuda"]},
            "axes": {a: [v] for a, v in axes.items()},
        },
        "cells": [cell.to_json()],
    }


def every_file(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text(encoding="utf-8") for p in root.rglob("*") if p.is_file()}


def test_printable_makes_hidden_characters_visible_and_redacts() -> None:
    assert printable(SPOOF) == "torch <U+202E>liaf<U+202C> ok"
    assert printable("a\u2066b\u2069c\u200ed\u200fe\u061cf") == "a<U+2066>b<U+2069>c<U+200E>d<U+200F>e<U+061C>f"
    assert printable("\x1b[31mred\x00\x7f\u0085\u2028") == "<U+001B>[31mred<U+0000><U+007F><U+0085><U+2028>"
    assert printable(f"line\n\tindented {LEAKY}") == f"line\n\tindented {SHOWN}"
    assert printable("ünïcödé × ✓ 中文") == "ünïcödé × ✓ 中文"
    assert md_text(SPOOF) == "torch \\<U+202E\\>liaf\\<U+202C\\> ok"
    assert md_code(f"{LEAKY} \u202e") == f"`{SHOWN} <U+202E>`"


def test_report_shows_no_credential_and_no_hidden_character(tmp_path: Path) -> None:
    src = tmp_path / "in" / "results.json"
    src.parent.mkdir()
    src.write_text(json.dumps(leaky_results(), ensure_ascii=False), encoding="utf-8")
    render_run(src, tmp_path / "out", history_dir=None)
    files = every_file(tmp_path / "out")
    assert sorted(files) == ["answers.json", "compat.md", "index.html", "results.json"]
    for name, text in files.items():
        assert PASSWORD not in text, name
        for ch in "\u202e\u202c\u2066\u2069\u200f\x1b":
            assert ch not in text or name == "results.json", (name, hex(ord(ch)))
    page = files["index.html"]
    assert f"<pre>uv pip install --index-url {SHOWN}</pre>" in page
    assert f"url = \\&quot;{SHOWN}\\&quot;" in page  # the files, shown as JSON
    assert "torch &lt;U+202E&gt;liaf&lt;U+202C&gt; ok" in page
    assert "&lt;U+001B&gt;[31mred&lt;U+001B&gt;[0m\tTab&lt;U+2066&gt;hidden&lt;U+2069&gt;" in page
    assert "gpubox&lt;U+202E&gt;-7" in page
    assert (
        f"| **2.9.1** | ⚠ error — **install**: `Failed to fetch: {SHOWN}/torch/ torch <U+202E>liaf<U+202C> ok` |"
        in files["compat.md"].splitlines()
    )
    # The copy of the results keeps its data (a reader may need the exact text) but not the password.
    copied = json.loads(files["results.json"])
    assert copied["cells"][0]["install"]["argv"][-1] == SHOWN
    assert copied["cells"][0]["stages"][0]["reason"] == f"Failed to fetch: {SHOWN}/torch/ {SPOOF}"


def test_the_published_site_carries_no_credential(tmp_path: Path) -> None:
    runs = tmp_path / "runs" / "20261202T101500Z-ab12"
    runs.mkdir(parents=True)
    (runs / "results.json").write_text(json.dumps(leaky_results()), encoding="utf-8")
    publish(tmp_path / "site", tmp_path / "runs")
    files = every_file(tmp_path / "site")
    assert sorted(files) == [
        ".nojekyll",
        "answers.json",
        "compat.md",
        "index.html",
        "results.json",
        "runs/20261202T101500Z-ab12/answers.json",
        "runs/20261202T101500Z-ab12/compat.md",
        "runs/20261202T101500Z-ab12/index.html",
        "runs/20261202T101500Z-ab12/results.json",
        "runs/index.html",
    ]
    assert [name for name, text in files.items() if PASSWORD in text] == []
    assert SHOWN in files["runs/20261202T101500Z-ab12/results.json"]
