"""The report: HTML grid, Markdown table, history diff and publish, rendered from results only."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from compatlab.cli import main
from compatlab.proc import run as run_proc
from compatlab.render import compat_md_diff, diff_runs, load, publish, render_run
from compatlab.render.markdown import md_code
from compatlab.runs.model import SCHEMA, CellResult, CellState, Expectation, InstallRecord, StageResult, StageState

SNAPSHOTS = Path(__file__).parent / "snapshots"
UPDATE = os.environ.get("COMPATLAB_UPDATE_SNAPSHOTS") == "1"
SYMBOL = "_ZN3c104cuda29c10_cuda_check_implementationEiPKcS2_ib"
DEMANGLED = "c10::cuda::c10_cuda_check_implementation(int, char const*, char const*, int, bool)"
XSS = "<script>alert(1)</script>"
# Would change the page title if it ever reached the page as markup instead of text.
TITLE_XSS = "<script>document.title='pwned'</script><img src=x onerror=\"document.title='pwned'\">"


# --- fixtures: results built in Python ---------------------------------------------------------------


def stage(name: str, state: str = "pass", reason: str = "", required: bool = True, **details: Any) -> StageResult:
    return StageResult(
        name=name, state=StageState(StageState(state)), reason=reason, details=details, seconds=0.5, required=required
    )


def cell(
    torch: str,
    fi: str,
    cuda: str,
    state: str,
    stages: list[StageResult] | None = None,
    *,
    reason: str = "",
    sgl: str = "0.3.21",
    expected: dict[str, str] | None = None,
    unexpected: bool = False,
) -> CellResult:
    axes = {"torch": torch, "sgl-kernel": sgl, "flashinfer": fi, "cuda": cuda}
    cid = f"torch{torch}-sglkernel{sgl}-flashinfer{fi}-cuda{cuda}"
    argv = [
        "uv",
        "pip",
        "install",
        "--python",
        f".venvs/{cid}/bin/python",
        f"torch=={torch}",
        f"sgl-kernel=={sgl}",
        f"flashinfer-python=={fi}",
    ]
    if state == "n/a":
        return CellResult(id=cid, axes=axes, state=CellState(state), reason=reason)
    return CellResult(
        id=cid,
        axes=axes,
        state=CellState(state),
        stages=tuple(stages or []),
        reason=reason,
        expected=Expectation(state=CellState(expected["state"]), reason=expected.get("reason", ""))
        if expected
        else None,
        unexpected=unexpected,
        install=InstallRecord(argv=tuple(argv)),
        freeze=(
            f"torch=={torch}",
            f"sgl-kernel=={sgl}",
            f"flashinfer-python=={fi}",
        ),
        started="2026-12-02T10:16:00+00:00",
        finished="2026-12-02T10:17:00+00:00",
        seconds=60.0,
    )


def ok_stages(tok_s: float = 96.0, busbw: float = 181.3) -> list[StageResult]:
    return [
        stage("resolve"),
        stage("install"),
        stage("pins"),
        stage("static"),
        stage("import"),
        stage("cuda"),
        stage("nccl", busbw_gbps=busbw),
        stage("perf", figures={"eagle3_tok_s": tok_s, "baseline_tok_s": 90.0, "speedup": tok_s / 90.0}),
    ]


def symbol_fail(reason: str = f"undefined symbol: {SYMBOL}") -> list[StageResult]:
    return [
        stage("resolve"),
        stage("install"),
        stage("pins"),
        stage(
            "static",
            "fail",
            f"needs {DEMANGLED}, torch exports the unsigned int variant",
            missing=[DEMANGLED],
            library="sgl_kernel/common_ops.abi3.so",
        ),
        stage(
            "import",
            "fail",
            reason,
            log="logs/import.txt",
            stderr=f"Traceback (most recent call last):\nImportError: {reason}",
        ),
        stage("cuda", "skip", "blocked: import failed"),
    ]


def base_cells() -> list[CellResult]:
    """One of each kind the grid knows: pass, fail, partial, error, n/a, known fail, and hostile text."""
    return [
        cell("2.9.1", "0.6.4", "12.8", "pass", ok_stages()),
        cell(
            "2.9.1",
            "0.7.4",
            "12.8",
            "partial",
            [stage("resolve"), stage("import"), stage("cuda", "skip", "skipped: no GPU")],
        ),
        cell("2.10.0", "0.6.4", "12.8", "fail", symbol_fail(), reason=f"undefined symbol: {SYMBOL}"),
        cell(
            "2.10.0",
            "0.7.4",
            "12.8",
            "fail",
            symbol_fail(),
            reason=f"undefined symbol: {SYMBOL}",
            expected={"state": "fail", "reason": "sgl-kernel 0.3.21 is built against torch 2.9"},
        ),
        cell(
            "2.9.1",
            "0.6.4",
            "13.0",
            "error",
            [
                stage(
                    "resolve",
                    "error",
                    "index unreachable: https://download.pytorch.org/whl (timed out after 60s)",
                )
            ],
            reason="index unreachable: https://download.pytorch.org/whl (timed out after 60s)",
        ),
        cell(
            "2.9.1",
            "0.7.4",
            "13.0",
            "fail",
            [stage("resolve"), stage("pins", "fail", f"resolver replaced torch | {XSS}", seen=[XSS])],
            reason=f"resolver replaced torch | {XSS}",
        ),
        cell(
            "2.10.0",
            "0.6.4",
            "13.0",
            "n/a",
            reason="flashinfer-python 0.6.4 is built for CUDA 12.8, this column is CUDA 13.0",
        ),
        cell("2.10.0", "0.7.4", "13.0", "pass", ok_stages(54.0, 120.0)),
    ]


def results(
    cells: list[CellResult],
    *,
    run_id: str = "20261202T101500Z-ab12",
    started: str = "2026-12-02T10:15:00+00:00",
    axes: dict[str, list[str]] | None = None,
) -> dict[str, Any]:
    if axes is None:
        axes = {}
        for c in cells:
            for a, v in c.axes.items():
                if v not in axes.setdefault(a, []):
                    axes[a].append(v)
    return {
        "schema": SCHEMA,
        "run": {
            "id": run_id,
            "started": started,
            "finished": "2026-12-02T11:02:00+00:00",
            "host": {
                "hostname": "gpubox-7",
                "platform": "Linux-6.8-x86_64",
                "python": "3.12.8",
                "gpus": ["NVIDIA H200"] * 8,
                "driver": "580.95.05",
            },
            "matrix": "matrix.toml",
            "matrix_name": "default",
            "report": {"rows": ["torch"], "columns": ["sgl-kernel", "flashinfer"], "tables": ["cuda"]},
            "axes": axes,
        },
        "cells": [c.to_json() for c in cells],
    }


def write(path: Path, data: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2), encoding="utf-8")
    return path


def td_cells(page: str) -> list[str]:
    return re.findall(r'<td class="cell ([^"]*)"', page)


# --- Markdown ---------------------------------------------------------------------------------------


def test_markdown_matches_snapshot(tmp_path: Path) -> None:
    src = write(tmp_path / "in" / "results.json", results(base_cells()))
    written = render_run(src, tmp_path / "out", history_dir=None)
    assert [p.name for p in written] == ["index.html", "compat.md", "answers.json", "results.json"]
    text = (tmp_path / "out" / "compat.md").read_text(encoding="utf-8")
    snapshot = SNAPSHOTS / "compat.md"
    if UPDATE:
        snapshot.write_text(text, encoding="utf-8")
    assert text == snapshot.read_text(encoding="utf-8")
    assert json.loads((tmp_path / "out" / "results.json").read_text()) == results(base_cells())


def test_md_code_holds_backticks_and_pipes() -> None:
    assert md_code("a | b") == "`a \\| b`"
    assert md_code("use `x`") == "`` use `x` ``"
    assert md_code("line one\n  line two") == "`line one line two`"


# --- HTML -------------------------------------------------------------------------------------------


def test_html_escapes_everything_from_outside(tmp_path: Path) -> None:
    src = write(tmp_path / "results.json", results(base_cells()))
    render_run(src, tmp_path, history_dir=None)
    page = (tmp_path / "index.html").read_text(encoding="utf-8")
    assert XSS not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert page.count("<script>") == 1  # the page's own, which interpolates nothing


def test_html_grid_shows_states_reasons_and_details(tmp_path: Path) -> None:
    src = write(tmp_path / "results.json", results(base_cells()))
    render_run(src, tmp_path, history_dir=None)
    page = (tmp_path / "index.html").read_text(encoding="utf-8")
    classes = td_cells(page)
    assert len(classes) == 8
    assert sorted(c.split()[0] for c in classes) == sorted(
        ["s-pass", "s-partial", "s-fail", "s-fail", "s-error", "s-fail", "s-na", "s-pass"]
    )
    assert "s-fail known" in classes
    assert page.count('<h2 id="t-') == 2
    expected = [
        ">CUDA 12.8</h2>",
        ">CUDA 13.0</h2>",
        '<span class="st">✓ pass</span>',
        '<span class="st">✗ fail</span><span class="tag known" title="the matrix expects this cell to fail">'
        "known</span>",
        '<span class="st">◐ partial</span>',
        '<span class="st">⚠ error</span>',
        '<span class="st">– n/a</span>',
        # A red cell: its first failing stage and that stage's reason, then the details behind it.
        f"<b>static</b>: needs {DEMANGLED}, torch exports the unsigned int variant</div>",
        f"<li><code>{DEMANGLED}</code></li>",
        f'<td class="reason">undefined symbol: {SYMBOL}</td>',
        "<pre>uv pip install --python .venvs/torch2.10.0-sglkernel0.3.21-flashinfer0.6.4-cuda12.8/bin/python "
        "torch==2.10.0 sgl-kernel==0.3.21 flashinfer-python==0.6.4</pre>",
        "<summary>freeze (3 packages)</summary>",
        "<div><code>logs/import.txt</code></div>",
        'title="n/a: flashinfer-python 0.6.4 is built for CUDA 12.8, this column is CUDA 13.0"',
        # Perf figures, generically.
        "busbw_gbps <b>181</b>",
        "eagle3_tok_s <b>96</b>",
        "speedup <b>1.07</b>",
    ]
    assert [text for text in expected if text not in page] == []


def test_render_200_cells(tmp_path: Path) -> None:
    states = ["pass", "fail", "partial", "error", "n/a"]
    cells = []
    for i, (t, s, f, c) in enumerate(
        (t, s, f, c)
        for c in ("12.8", "13.0")
        for t in ("2.8.0", "2.9.0", "2.9.1", "2.10.0", "2.11.0")
        for s in ("0.3.19", "0.3.20", "0.3.21", "0.4.0")
        for f in ("0.5.3", "0.6.0", "0.6.4", "0.7.0", "0.7.4")
    ):
        state = states[i % len(states)]
        stages = ok_stages() if state == "pass" else symbol_fail(f"undefined symbol {i} " + "x" * 300)
        cells.append(cell(t, f, c, state, stages, sgl=s, reason="" if state == "pass" else f"reason {i}"))
    src = write(tmp_path / "results.json", results(cells))
    start = time.monotonic()
    render_run(src, tmp_path, history_dir=None)
    assert time.monotonic() - start < 10
    page = (tmp_path / "index.html").read_text(encoding="utf-8")
    assert len(td_cells(page)) == 200
    assert page.count('<th scope="colgroup" colspan="5"><span class="ax">sgl-kernel</span>') == 8
    md = (tmp_path / "compat.md").read_text(encoding="utf-8")
    assert md.count("\n| **") == 10


def test_many_perf_figures_show_a_headline_and_all_in_the_panel(tmp_path: Path) -> None:
    figs = {
        f"{who}_{what}_c{c}": 1.5 * c for who in ("baseline", "eagle3") for what in ("tok_s", "ttft_ms") for c in (1, 8)
    }
    figs |= {
        "speedup_c1": 1.07,
        "speedup_c8": 1.2,
        "accept_length_c1": 3.1,
        "verdict": True,
    }  # a bool is not a figure
    stages = [stage("nccl", busbw_gbps=181.3), stage("perf", figures=figs, log_tail="line 1\nline 2")]
    src = write(tmp_path / "results.json", results([cell("2.9.1", "0.6.4", "12.8", "pass", stages)]))
    render_run(src, tmp_path, history_dir=None)
    page = (tmp_path / "index.html").read_text(encoding="utf-8")
    summary = page.split("<summary>")[1].split("</summary>")[0]
    assert re.findall(r'<span title="([^"]+)">', summary) == [
        "busbw_gbps",
        "speedup_c1",
        "speedup_c8",
        "baseline_tok_s_c1",
    ]
    assert '<span class="muted">+8 more</span>' in summary
    assert page.count('<td class="secs">') == 12 + 2  # every numeric figure, plus the two stages' times
    assert "verdict</td>" not in page
    assert "<pre>line 1\nline 2</pre>" in page
    md = (tmp_path / "compat.md").read_text(encoding="utf-8")
    assert "✓ pass (busbw\\_gbps 181, speedup\\_c1 1.07, speedup\\_c8 1.2, baseline\\_tok\\_s\\_c1 1.5, +8 more)" in md


def test_run_in_progress_without_cells(tmp_path: Path) -> None:
    data = results([])
    data["run"]["finished"] = None
    del data["run"]["report"]
    src = write(tmp_path / "results.json", data)
    render_run(src, tmp_path, history_dir=None)
    page = (tmp_path / "index.html").read_text(encoding="utf-8")
    assert "<div><dt>finished</dt><dd>in progress</dd></div>" in page
    assert '<p class="muted">This run has no cells yet.</p>' in page
    assert td_cells(page) == []


def test_axes_the_report_does_not_place_become_columns(tmp_path: Path) -> None:
    cells = [cell("2.9.1", "0.6.4", "12.8", "pass", ok_stages()) for _ in range(2)]
    cells = [
        dataclasses.replace(c, id=f"{c.id}-python{py}", axes={**c.axes, "python": py})
        for c, py in zip(cells, ("3.11", "3.12"), strict=True)
    ]
    src = write(tmp_path / "results.json", results(cells))
    render_run(src, tmp_path, history_dir=None)
    page = (tmp_path / "index.html").read_text(encoding="utf-8")
    assert len(td_cells(page)) == 2
    assert '<span class="ax">python</span>3.12</th>' in page


# --- history ----------------------------------------------------------------------------------------


def two_runs() -> tuple[dict[str, Any], dict[str, Any]]:
    old = base_cells()
    new = base_cells()
    # newly green: the symbol fail now passes; newly red: the partial now fails; reason changed: the error.
    new[2] = cell("2.10.0", "0.6.4", "12.8", "pass", ok_stages())
    nvrtc = "libnvrtc.so.13: cannot open shared object file"
    new[1] = cell("2.9.1", "0.7.4", "12.8", "fail", [stage("install"), stage("import", "fail", nvrtc)], reason=nvrtc)
    new[4] = cell(
        "2.9.1",
        "0.6.4",
        "13.0",
        "error",
        [stage("install", "error", "uv timed out after 3600s")],
        reason="uv timed out after 3600s",
    )
    # removed and new cells: one flashinfer version goes, one sgl-kernel version comes.
    del new[7]
    new.append(cell("2.9.1", "0.6.4", "12.8", "pass", ok_stages(), sgl="0.4.0"))
    return (
        results(old, run_id="20261201T101500Z-aa00", started="2026-12-01T10:15:00+00:00"),
        results(new, run_id="20261202T101500Z-ab12", started="2026-12-02T10:15:00+00:00"),
    )


def test_history_diff_names_every_kind_of_change(tmp_path: Path) -> None:
    old, new = two_runs()
    old_run = load(write(tmp_path / "old.json", old))
    new_run = load(write(tmp_path / "new.json", new))
    assert [(c.kind, c.cell_id) for c in diff_runs(old_run, new_run)] == [
        ("newly-red", "torch2.9.1-sglkernel0.3.21-flashinfer0.7.4-cuda12.8"),
        ("newly-green", "torch2.10.0-sglkernel0.3.21-flashinfer0.6.4-cuda12.8"),
        ("reason", "torch2.9.1-sglkernel0.3.21-flashinfer0.6.4-cuda13.0"),
        ("new", "torch2.9.1-sglkernel0.4.0-flashinfer0.6.4-cuda12.8"),
        ("removed", "torch2.10.0-sglkernel0.3.21-flashinfer0.7.4-cuda13.0"),
    ]
    assert compat_md_diff(old, new) == (
        "## compatlab: run `20261202T101500Z-ab12` compared with `20261201T101500Z-aa00`\n"
        "\n"
        "✓ pass 3 · ✗ fail 3 (1 known) · ◐ partial 0 · ⚠ error 1 · – n/a 1\n"
        "\n"
        "### Newly red (1)\n"
        "\n"
        "- torch 2.9.1 · sgl-kernel 0.3.21 · flashinfer 0.7.4 · cuda 12.8: ◐ partial → ✗ fail — "
        "`libnvrtc.so.13: cannot open shared object file`\n"
        "\n"
        "### Newly green (1)\n"
        "\n"
        "- torch 2.10.0 · sgl-kernel 0.3.21 · flashinfer 0.6.4 · cuda 12.8: ✗ fail → ✓ pass "
        f"(was `needs {DEMANGLED}, torch exports the unsigned in…`)\n"
        "\n"
        "### Reason changed (1)\n"
        "\n"
        "- torch 2.9.1 · sgl-kernel 0.3.21 · flashinfer 0.6.4 · cuda 13.0 (⚠ error): "
        "`index unreachable: https://download.pytorch.org/whl (timed out after 60s)` → "
        "`uv timed out after 3600s`\n"
        "\n"
        "### New cells (1)\n"
        "\n"
        "- torch 2.9.1 · sgl-kernel 0.4.0 · flashinfer 0.6.4 · cuda 12.8: ✓ pass\n"
        "\n"
        "### Removed cells (1)\n"
        "\n"
        "- torch 2.10.0 · sgl-kernel 0.3.21 · flashinfer 0.7.4 · cuda 13.0 (was ✓ pass)\n"
    )
    assert compat_md_diff(old, old).endswith("No cell changed state or reason.\n")


def test_report_marks_changes_against_the_previous_run_by_start_time(tmp_path: Path) -> None:
    old, new = two_runs()
    runs = tmp_path / "reports" / "runs"
    # Directory names sort the other way round: the previous run is chosen by start time.
    write(runs / "b-older" / "results.json", old)
    write(runs / "a-newer" / "results.json", new)
    ancient = results(base_cells(), run_id="20261101T000000Z-0000", started="2026-11-01T00:00:00+00:00")
    ancient["cells"][0] = cell("2.9.1", "0.6.4", "12.8", "pass", ok_stages(80.0)).to_json()
    write(runs / "z-ancient" / "results.json", ancient)
    latest = write(tmp_path / "reports" / "latest" / "results.json", new)
    written = render_run(latest, latest.parent, history_dir=runs)
    assert [p.name for p in written] == ["index.html", "compat.md", "answers.json", "results.json", "changes.md"]
    page = (latest.parent / "index.html").read_text(encoding="utf-8")
    assert "5 changes since run <code>20261201T101500Z-aa00</code>" in page
    assert 'class="cell s-fail changed" id="c-torch2.9.1-sglkernel0.3.21-flashinfer0.7.4-cuda12.8"' in page
    assert '<span class="tag chg chg-newly-red" title="newly red (was partial)">▼ red</span>' in page
    assert '<span class="tag chg chg-newly-green" title="newly green (was fail)">▲ green</span>' in page
    assert ">≠ reason</span>" in page
    # Perf over the three runs: a sparkline per figure, 80 → 96 → 96 tok/s.
    assert 'aria-label="eagle3_tok_s over the last 3 runs: 80, 96, 96"' in page
    changes = (latest.parent / "changes.md").read_text(encoding="utf-8")
    assert changes.startswith("## compatlab: run `20261202T101500Z-ab12` compared with `20261201T101500Z-aa00`")
    assert "### Perf figures that moved" not in changes


def test_diff_reports_perf_that_moved(tmp_path: Path) -> None:
    old = results([cell("2.9.1", "0.6.4", "12.8", "pass", ok_stages(54.0))], run_id="r1")
    new = results(
        [cell("2.9.1", "0.6.4", "12.8", "pass", ok_stages(96.0))],
        run_id="r2",
        started="2026-12-03T10:15:00+00:00",
    )
    assert compat_md_diff(old, new).endswith(
        "No cell changed state or reason.\n"
        "### Perf figures that moved 5% or more (2)\n"
        "\n"
        "- torch 2.9.1 · sgl-kernel 0.3.21 · flashinfer 0.6.4 · cuda 12.8: eagle3\\_tok\\_s 54 → 96 (+78%)\n"
        "- torch 2.9.1 · sgl-kernel 0.3.21 · flashinfer 0.6.4 · cuda 12.8: speedup 0.6 → 1.07 (+78%)\n"
    )


# --- publish ----------------------------------------------------------------------------------------


def test_publish_keeps_older_runs_reachable(tmp_path: Path) -> None:
    old, new = two_runs()
    runs, site = tmp_path / "runs", tmp_path / "site"
    write(runs / "20261201T101500Z-aa00" / "results.json", old)
    site.mkdir()
    (site / "CNAME").write_text("compat.example.org\n")
    publish(site, runs)
    assert (site / "runs" / "20261201T101500Z-aa00" / "index.html").is_file()
    # The next night: the old run is pruned from the lab's disk, a new one arrives.
    shutil.rmtree(runs / "20261201T101500Z-aa00")
    write(runs / "20261202T101500Z-ab12" / "results.json", new)
    publish(site, runs)
    assert (site / "CNAME").read_text() == "compat.example.org\n"
    assert (site / ".nojekyll").is_file()
    assert (site / "runs" / "20261201T101500Z-aa00" / "index.html").is_file()
    listing = (site / "runs" / "index.html").read_text(encoding="utf-8")
    assert listing.index('href="20261202T101500Z-ab12/index.html"') < listing.index(
        'href="20261201T101500Z-aa00/index.html"'
    )
    front = (site / "index.html").read_text(encoding="utf-8")
    assert "<h1>Run <code>20261202T101500Z-ab12</code></h1>" in front
    assert 'href="runs/20261201T101500Z-aa00/index.html"' in front
    assert json.loads((site / "results.json").read_text())["run"]["id"] == "20261202T101500Z-ab12"
    assert (site / "compat.md").is_file()


def test_publish_keeps_run_ids_inside_the_site(tmp_path: Path) -> None:
    write(tmp_path / "runs" / "x" / "results.json", results(base_cells(), run_id="../../escape"))
    publish(tmp_path / "site", tmp_path / "runs")
    assert (tmp_path / "site" / "runs" / "_.._escape" / "index.html").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs", "site"]


def test_publish_without_runs_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["publish", "--site", str(tmp_path / "site"), "--runs", str(tmp_path / "none")]) == 2
    assert capsys.readouterr().err == (
        f"error: {tmp_path / 'none'}: no runs found (expected <run-id>/results.json); run `nox -s matrix` first\n"
    )


# --- CLI --------------------------------------------------------------------------------------------


def test_cli_defaults_to_reports_latest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    old, new = two_runs()
    write(tmp_path / "reports" / "runs" / "20261201T101500Z-aa00" / "results.json", old)
    write(tmp_path / "reports" / "latest" / "results.json", new)
    monkeypatch.chdir(tmp_path)
    assert main(["report"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "reports/latest/index.html",
        "reports/latest/compat.md",
        "reports/latest/answers.json",
        "reports/latest/results.json",
        "reports/latest/changes.md",
    ]
    # As `compatlab report …` hands it over: without the subcommand's name.
    assert main(["report", "reports/latest/results.json", "--out", "site", "--no-history"]) == 0
    assert sorted(p.name for p in (tmp_path / "site").iterdir()) == [
        "answers.json",
        "compat.md",
        "index.html",
        "results.json",
    ]


def lab_cli(cwd: Path, *args: str) -> tuple[int, str]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[3] / "src")}
    done = run_proc([sys.executable, "-m", "compatlab", *args], timeout=60, env=env, cwd=cwd)
    return done.returncode, done.stderr


def test_python_m_compatlab_report(tmp_path: Path) -> None:
    old, new = two_runs()
    write(tmp_path / "reports" / "runs" / "20261201T101500Z-aa00" / "results.json", old)
    latest = write(tmp_path / "reports" / "latest" / "results.json", new)
    assert lab_cli(tmp_path, "report", str(latest)) == (0, "")
    assert (latest.parent / "changes.md").is_file()
    assert lab_cli(tmp_path, "report", "nowhere/results.json") == (
        2,
        "error: nowhere/results.json: no such file; run `nox -s matrix` first\n",
    )


def test_python_m_compatlab_publish(tmp_path: Path) -> None:
    write(tmp_path / "reports" / "runs" / "20261201T101500Z-aa00" / "results.json", two_runs()[0])
    assert lab_cli(tmp_path, "publish", "--site", "site", "--runs", "reports/runs") == (0, "")
    assert (tmp_path / "site" / "runs" / "20261201T101500Z-aa00" / "index.html").is_file()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no such file; run `nox -s matrix` first"),
        (
            "{not json",
            "not valid JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)",
        ),
        (
            '{"schema": "compatlab.results/0"}',
            "schema: expected 'compatlab.results/1', got 'compatlab.results/0'",
        ),
        (
            json.dumps({"schema": SCHEMA, "run": {"id": "x"}, "cells": [{"id": "c", "axes": {}, "state": "green"}]}),
            "cells[0] (c): state: expected one of pass, fail, partial, error, n/a, got 'green'",
        ),
        (
            json.dumps({"schema": SCHEMA, "run": {"id": "x"}, "cells": [{"axes": {}, "state": "pass"}]}),
            "cells[0]: missing key 'id'",
        ),
    ],
)
def test_cli_bad_input_names_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None, message: str
) -> None:
    path = tmp_path / "results.json"
    if content is not None:
        path.write_text(content)
    assert main(["report", str(path), "--no-history"]) == 2
    assert capsys.readouterr().err == f"error: {path}: {message}\n"
    assert not (tmp_path / "index.html").exists()


# --- a real browser ---------------------------------------------------------------------------------

needs_chromium = pytest.mark.skipif(
    shutil.which("chromium") is None,
    reason="chromium not installed (CI: apt-get update && apt-get install -y chromium)",
)


def chromium(tmp_path: Path, *args: str) -> str:
    argv = [
        "chromium",
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--user-data-dir={tmp_path / 'profile'}",
        *args,
    ]
    done = run_proc(argv, timeout=120)
    assert done.ok, done.stderr[-2000:]
    return done.stdout


@needs_chromium
def test_chromium_renders_the_grid_and_runs_no_injected_script(tmp_path: Path) -> None:
    cells = base_cells()
    stages = list(cells[5].stages)
    stages[1] = dataclasses.replace(stages[1], reason=TITLE_XSS)
    cells[5] = dataclasses.replace(cells[5], reason=TITLE_XSS, stages=tuple(stages))
    src = write(tmp_path / "results.json", results(cells))
    render_run(src, tmp_path, history_dir=None)
    dom = chromium(tmp_path, "--virtual-time-budget=2000", "--dump-dom", (tmp_path / "index.html").as_uri())
    assert "<title>compatlab · default · run 20261202T101500Z-ab12</title>" in dom
    assert "pwned" not in re.sub(r"&lt;.*?&gt;", "", dom.split("<main>")[0])
    assert '<div class="tools" id="tools">' in dom  # the page's own script did run
    assert len(td_cells(dom)) == 8
    assert re.findall(r'data-state="([^"]+)"', dom) == [
        "pass",
        "partial",
        "fail",
        "fail",
        "error",
        "fail",
        "n/a",
        "pass",
    ]
    assert f"undefined symbol: {SYMBOL}" in dom
    assert "&lt;script&gt;document.title='pwned'&lt;/script&gt;" in dom
    assert "<img" not in dom


@needs_chromium
def test_chromium_screenshot(tmp_path: Path) -> None:
    src = write(tmp_path / "results.json", results(base_cells()))
    render_run(src, tmp_path, history_dir=None)
    png = tmp_path / "grid.png"
    chromium(
        tmp_path,
        f"--screenshot={png}",
        "--window-size=1280,900",
        "--hide-scrollbars",
        (tmp_path / "index.html").as_uri(),
    )
    data = png.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    assert len(data) > 10_000
    keep = os.environ.get("COMPATLAB_SCREENSHOT")
    if keep:
        shutil.copyfile(png, keep)


def test_green_and_amber_cells_show_their_warnings(tmp_path: Path) -> None:
    mix = "CUDA 13 package cuda-bindings 13.5.0 beside a CUDA 12.8 stack (flashinfer-python 0.6.4 requires 'cuda-bindings')"
    stages = [
        stage("install"),
        stage("pins", "warn", mix),
        stage("static", "warn", "no Requires-Dist on torch"),
        stage("import"),
        stage("cuda", "skip", "no NVIDIA driver on this machine (no libcuda.so.1)"),
    ]
    data = results(
        [
            cell(
                "2.9.1",
                "0.6.4",
                "12.8",
                "partial",
                stages,
                reason="cuda: no NVIDIA driver on this machine (no libcuda.so.1)",
            )
        ]
    )
    render_run(write(tmp_path / "results.json", data), tmp_path / "out", history_dir=None)
    page = (tmp_path / "out" / "index.html").read_text()
    assert (
        "warning · <b>pins</b>: CUDA 13 package cuda-bindings 13.5.0 beside a CUDA 12.8 stack "
        "(flashinfer-python 0.6.4 requires &#x27;cuda-bindings&#x27;) (+1 more)</div>"
    ) in page
