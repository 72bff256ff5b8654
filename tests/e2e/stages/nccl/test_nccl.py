"""The NCCL suite: arithmetic and thresholds in-process; the gloo path end to end in real processes.

The real-process tests need an interpreter with (CPU) torch: ``COMPATLAB_TEST_TORCH_PYTHON``, or this
interpreter if it has torch. CI provides one; without it they skip and say so.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from compatlab.cli import main as cli_main
from compatlab.config.matrix import parse_matrix
from compatlab.errors import ConfigError, UsageError
from compatlab.runs.model import StageState
from compatlab.stages.base import CellContext
from compatlab.stages.nccl.stage import (
    MIB,
    NcclHook,
    NcclReport,
    NcclThresholds,
    NcclTimeouts,
    algbw_gbps,
    bus_factor,
    busbw_gbps,
    default_sizes,
    nccl_thresholds,
    parse_test_hook,
    run_nccl,
    run_nccl_stage,
)

FAST = NcclTimeouts(init=60, correctness=60, bandwidth=60, grace=2, stack=3)
COUNTS = (1, 1023, 4099)  # one, odd, and not a power of two; small, the CI box has two cores
SIZES = (4096, 65536)


@pytest.fixture(scope="session")
def torch_python() -> Path:
    given = os.environ.get("COMPATLAB_TEST_TORCH_PYTHON")
    if given:
        python = Path(given)
    elif importlib.util.find_spec("torch") is not None:
        python = Path(sys.executable)
    else:
        pytest.skip("no interpreter with torch: set COMPATLAB_TEST_TORCH_PYTHON to one (CPU torch will do)")
    probe = subprocess.run(
        [str(python), "-c", "import torch.distributed as d; assert d.is_available() and d.is_gloo_available()"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if probe.returncode != 0:
        pytest.skip(f"{python} cannot run torch.distributed with gloo: {probe.stderr.strip()[-300:]}")
    return python


def _run(
    python: Path,
    tmp_path: Path,
    *,
    world_size: int = 2,
    hook: str | None = None,
    timeouts: NcclTimeouts = FAST,
    sizes: tuple[int, ...] = (),
    env: dict[str, str] | None = None,
    thresholds: NcclThresholds | None = None,
) -> NcclReport:
    return run_nccl(
        python,
        world_size=world_size,
        backend="gloo",
        env=env or dict(os.environ),
        timeouts=timeouts,
        sizes=sizes,
        thresholds=thresholds,
        work_dir=tmp_path / "nccl",
        test_hook=hook,
        check_counts=COUNTS,
        warmup=1,
        iters=2,
    )


def _assert_all_gone(report: NcclReport) -> None:
    for status in report.ranks:
        with pytest.raises(ProcessLookupError):
            os.kill(status["pid"], 0)


# ---------------------------------------------------------------------------------------------------
# Arithmetic


@pytest.mark.parametrize(
    ("op", "n", "factor"),
    [
        ("all_reduce", 8, 1.75),
        ("all_reduce", 2, 1.0),
        ("all_reduce", 1, 0.0),
        ("all_gather", 8, 0.875),
        ("reduce_scatter", 4, 0.75),
        ("broadcast", 8, 1.0),
        ("broadcast", 1, 1.0),
    ],
)
def test_bus_factor_is_nccl_tests(op: str, n: int, factor: float) -> None:
    assert bus_factor(op, n) == factor


def test_busbw_from_time() -> None:
    # 1 GiB all_reduce over 8 ranks in 5 ms: algbw 214.7 GB/s, busbw 1.75 times that.
    assert algbw_gbps(1 << 30, 0.005) == pytest.approx(214.748, abs=1e-3)
    assert busbw_gbps("all_reduce", 1 << 30, 0.005, 8) == pytest.approx(375.809, abs=1e-3)
    assert busbw_gbps("all_gather", 1 << 30, 0.005, 8) == pytest.approx(187.905, abs=1e-3)
    with pytest.raises(ValueError, match="unknown collective 'all_to_all'"):
        bus_factor("all_to_all", 8)
    with pytest.raises(ValueError, match="time must be positive"):
        algbw_gbps(1, 0.0)


def test_default_sizes_sweep_one_mib_to_one_gib() -> None:
    sizes = default_sizes()
    assert sizes[0] == MIB
    assert sizes[-1] == 1 << 30
    assert len(sizes) == 11
    assert default_sizes(step=4) == (1 << 20, 1 << 22, 1 << 24, 1 << 26, 1 << 28, 1 << 30)


# ---------------------------------------------------------------------------------------------------
# Test hook and thresholds


def test_parse_test_hook() -> None:
    assert parse_test_hook("corrupt:rank1") == NcclHook(action="corrupt", rank=1)
    assert parse_test_hook("hang:rank1:init") == NcclHook(action="hang", rank=1, phase="init")
    assert parse_test_hook("die:rank0:correctness:SIGKILL").exit == "SIGKILL"
    assert str(parse_test_hook("die:rank0:correctness")) == "die:rank0:correctness:3"
    with pytest.raises(ValueError, match=r"^COMPATLAB_NCCL_TEST_HOOK=") as info:
        parse_test_hook("hang:rank1:teardown")
    assert str(info.value) == (
        "COMPATLAB_NCCL_TEST_HOOK='hang:rank1:teardown': expected corrupt:rankN[:OP], hang:rankN:PHASE or "
        "die:rankN:PHASE[:EXITCODE|SIGNAME] (PHASE: init, correctness, bandwidth)"
    )


def test_bad_hook_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as info:
        run_nccl(
            Path(sys.executable),
            world_size=2,
            backend="gloo",
            env={},
            timeouts=FAST,
            sizes=(),
            thresholds=None,
            work_dir=tmp_path,
            test_hook="corrupt:rank1:all_to_all",
        )
    assert str(info.value) == (
        "COMPATLAB_NCCL_TEST_HOOK='corrupt:rank1:all_to_all': expected corrupt:rankN[:OP], hang:rankN:PHASE "
        "or die:rankN:PHASE[:EXITCODE|SIGNAME] (PHASE: init, correctness, bandwidth); unknown OP "
        "'all_to_all' (known: all_reduce, all_gather, reduce_scatter, broadcast)"
    )


def test_thresholds_top_level_and_per_target() -> None:
    table = {"nccl": {"min-busbw-gbps": 300, "h200x8": {"min-busbw-gbps": 350.5}}}
    assert nccl_thresholds({}) == NcclThresholds()
    top = nccl_thresholds(table, target="other", targets=["h200x8", "other"])
    assert top == NcclThresholds(min_busbw_gbps=300.0, source="matrix.toml: thresholds.nccl.min-busbw-gbps")
    per = nccl_thresholds(table, target="h200x8", targets=["h200x8", "other"])
    assert per.min_busbw_gbps == 350.5
    assert per.source == "matrix.toml: thresholds.nccl.h200x8.min-busbw-gbps"


def test_threshold_errors_are_all_reported() -> None:
    table = {
        "nccl": {
            "min-busbw-gbps": "fast",
            "min-busbw-gpbs": 3,
            "h200x9": {"min-busbw-gbps": 1},
            "h200x8": {"min-busbw-gbps": True, "floor": 2},
        }
    }
    with pytest.raises(ConfigError) as info:
        nccl_thresholds(table, targets=["h200x8"])
    assert str(info.value) == (
        "5 problems in matrix.toml:\n"
        "  matrix.toml: thresholds.nccl.min-busbw-gbps: expected a positive number of GB/s, got 'fast'\n"
        "  matrix.toml: thresholds.nccl.min-busbw-gpbs: unknown key; perhaps you meant 'min-busbw-gbps'?\n"
        "  matrix.toml: thresholds.nccl.h200x9: not a target; perhaps you meant 'h200x8'?\n"
        "  matrix.toml: thresholds.nccl.h200x8.floor: unknown key; allowed keys: min-busbw-gbps\n"
        "  matrix.toml: thresholds.nccl.h200x8.min-busbw-gbps: expected a positive number of GB/s, got true"
    )


def test_threshold_single_error_and_non_table() -> None:
    with pytest.raises(ConfigError) as info:
        nccl_thresholds({"nccl": {"min-busbw-gbps": -1}})
    assert str(info.value) == (
        "matrix.toml: thresholds.nccl.min-busbw-gbps: expected a positive number of GB/s, got -1"
    )
    with pytest.raises(ConfigError) as info:
        nccl_thresholds({"nccl": 300}, path="lab/matrix.toml")
    assert str(info.value) == "lab/matrix.toml: thresholds.nccl: expected a table, got 300"


def test_a_missing_interpreter_is_an_error_not_a_verdict(tmp_path: Path) -> None:
    report = run_nccl(
        Path("/nonexistent/python"),
        world_size=2,
        backend="gloo",
        env={},
        timeouts=FAST,
        sizes=(),
        thresholds=None,
        work_dir=tmp_path,
    )
    assert report.state == StageState.ERROR
    assert report.reason == (
        "cannot start rank 0 with /nonexistent/python: [Errno 2] No such file or directory: '/nonexistent/python'"
    )


# ---------------------------------------------------------------------------------------------------
# The gloo path in real processes


@pytest.mark.parametrize("world_size", [2, 3])
def test_gloo_run_passes(torch_python: Path, tmp_path: Path, world_size: int) -> None:
    env = {**os.environ, "NCCL_ALGO": "Ring", "NCCL_NVLS_ENABLE": "1"}
    report = _run(torch_python, tmp_path, world_size=world_size, sizes=SIZES, env=env)
    assert report.state == StageState.PASS, report.reason
    assert report.reason.startswith(f"{world_size} ranks (gloo): 48 checks right, all_reduce busbw ")
    assert report.torch_version
    assert report.init_seconds is not None
    assert report.nccl_version is None
    assert len(report.correctness) == 4 * 4 * len(COUNTS)
    assert all(c["ok"] and c["ranks"] == world_size for c in report.correctness)
    # The multicast switch is forced off even where the caller asked for it, and says so.
    assert report.env["NCCL_NVLS_ENABLE"] == "0"
    assert report.env["NCCL_ALGO"] == "Ring"
    assert report.env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
    assert report.env["NVSHMEM_DISABLE_NVLS"] == "1"
    assert "NCCL_NVLS_ENABLE=1 overridden to 0: NVLink multicast stays off" in report.notes
    assert set(report.sweep) == {"all_reduce", "all_gather", "reduce_scatter", "broadcast"}
    for op, table in report.sweep.items():
        assert set(table) == set(SIZES)
        for row in table.values():
            assert len(row["busbw_gbps_sweeps"]) == 3
            assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * bus_factor(op, world_size), rel=1e-2)
    assert report.busbw_gbps == report.sweep["all_reduce"][65536]["busbw_gbps"]
    details = json.loads(json.dumps(report.details()))  # what the stage stores must be JSON
    assert details["world_size"] == world_size
    assert details["backend"] == "gloo"
    _assert_all_gone(report)


def test_wrong_result_names_op_dtype_size_rank_and_values(torch_python: Path, tmp_path: Path) -> None:
    report = _run(torch_python, tmp_path, hook="corrupt:rank1:all_reduce")
    assert report.state == StageState.FAIL
    assert report.failures[0] == (
        "all_reduce float32 × 1 elements on rank 1: element 0 expected 3, got 4 (1 of 1 elements differ)"
    )
    assert (
        "all_reduce bfloat16 × 1023 elements on rank 1: element 0 expected 3, got 4 (1 of 1023 elements "
        "differ)" in report.failures
    )
    assert len(report.failures) == 4 * len(COUNTS)  # every dtype and size of all_reduce, rank 1 only
    assert report.reason == f"wrong result: {report.failures[0]} (and {len(report.failures) - 1} more)"
    bad = [c for c in report.correctness if not c["ok"]]
    assert {c["op"] for c in bad} == {"all_reduce"}
    assert bad[0]["failures"][0]["rank"] == 1
    assert bad[0]["failures"][0]["expected"] == 3


@pytest.mark.slow
@pytest.mark.parametrize("phase", ["init", "correctness"])
def test_hang_names_the_rank_and_its_stack(torch_python: Path, tmp_path: Path, phase: str) -> None:
    timeouts = NcclTimeouts(init=8 if phase == "init" else 60, correctness=3, bandwidth=60, grace=2, stack=3)
    report = _run(torch_python, tmp_path, hook=f"hang:rank1:{phase}", timeouts=timeouts)
    assert report.state == StageState.FAIL
    assert report.hang is not None
    assert report.hang["phase"] == phase
    assert report.hang["ranks"] == [1]
    where = report.hang["where"][1]
    assert re.fullmatch(r"nccl_worker\.py:\d+ in _injected_hang", where)
    assert re.fullmatch(
        rf"hang in {phase} after {timeouts.phase(phase):g} s: rank 1 at {where} \(rank 0 waiting\)", report.reason
    )
    stack = report.hang["stacks"][1]["stack"]
    assert "in _fire_hook" in stack
    assert f"in {phase}" in stack
    # Rank 0 waits for rank 1 inside torch.distributed, and its stack says so.
    assert "distributed" in report.hang["stacks"][0]["stack"]
    # Found within its timeout (plus the time to start, ask for stacks and kill), every rank gone.
    assert report.seconds < (timeouts.init if phase == "init" else 30) + timeouts.correctness + 10
    _assert_all_gone(report)


def test_dead_rank_reported_with_exit_code(torch_python: Path, tmp_path: Path) -> None:
    report = _run(torch_python, tmp_path, hook="die:rank0:correctness:7")
    assert report.state == StageState.FAIL
    assert report.crash is not None
    assert report.crash["rank"] == 0
    assert report.crash["returncode"] == 7
    assert report.crash["phase"] == "correctness"
    assert report.crash["signal"] is None
    assert report.reason.startswith("rank 0 died in correctness (exit code 7)")
    _assert_all_gone(report)


def test_dead_rank_reported_with_signal_and_survivor_stacks(torch_python: Path, tmp_path: Path) -> None:
    report = _run(torch_python, tmp_path, hook="die:rank1:init:SIGKILL")
    assert report.state == StageState.FAIL
    assert report.crash is not None
    assert report.crash["rank"] == 1
    assert report.crash["signal"] == "SIGKILL"
    # Rank 0 waits at the rendezvous for a rank that will never come: after the grace, its stack is taken.
    assert report.reason == "rank 1 died in init (killed by SIGKILL); rank 0 hung after it"
    assert "init_process_group" in report.crash["stacks_of_survivors"][0]["stack"]
    _assert_all_gone(report)


def test_threshold_judges_all_reduce_at_the_largest_size(torch_python: Path, tmp_path: Path) -> None:
    floor = NcclThresholds(min_busbw_gbps=1e6, source="matrix.toml: thresholds.nccl.min-busbw-gbps")
    report = _run(torch_python, tmp_path, sizes=(4096,), thresholds=floor)
    assert report.state == StageState.FAIL
    assert re.fullmatch(
        r"all_reduce busbw \d+\.\d GB/s at 4 KiB is below the floor of 1e\+06 GB/s "
        r"\(matrix\.toml: thresholds\.nccl\.min-busbw-gbps\)",
        report.reason,
    )
    assert report.threshold is not None
    assert report.threshold["ok"] is False
    assert report.threshold["size_bytes"] == 4096


@pytest.mark.slow
def test_stage_on_a_cpu_box_runs_gloo_and_skips(torch_python: Path, tmp_path: Path) -> None:
    text = """
[axes]
torch = "2.9.1"
sgl-kernel = "0.3.21"
flashinfer = "0.6.4"
cuda = "13.0"
[targets.h200x8]
gpus = 8
nccl-env = { NCCL_PROTO = "Simple" }
[thresholds.nccl]
min-busbw-gbps = 300
"""
    import tomllib

    from compatlab.cells import expand

    matrix = parse_matrix(tomllib.loads(text))
    venv = torch_python.parent.parent
    ctx = CellContext(
        matrix=matrix, cell=expand(matrix)[0], venv=venv, python=torch_python, site_packages=venv, work_dir=tmp_path
    )
    result = run_nccl_stage(ctx)
    assert result.name == "nccl"
    assert result.required
    if result.details.get("backend") == "nccl":  # pragma: no cover - a GPU box
        pytest.skip("this machine has a GPU; the CPU path is not taken")
    assert (result.state, result.reason) == ("skip", "no GPU: nccl backend skipped, gloo ran")
    assert result.details["world_size"] == 2
    assert result.details["env"]["NCCL_PROTO"] == "Simple"
    assert all(c["ok"] for c in result.details["correctness"])


@pytest.mark.slow
def test_cli_prints_the_table_and_writes_json(
    torch_python: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "nccl.json"
    rc = cli_main(
        [
            "nccl",
            "--python",
            str(torch_python),
            "--backend",
            "gloo",
            "--world-size",
            "2",
            "--min-size",
            "64KiB",
            "--max-size",
            "64KiB",
            "--iters",
            "2",
            "--warmup",
            "1",
            "--check-counts",
            "1,1023",
            "--work-dir",
            str(tmp_path / "w"),
            "--json",
            str(out),
        ]
    )
    printed = capsys.readouterr().out
    assert rc == 0, printed
    assert printed.startswith("nccl suite: pass: 2 ranks (gloo): 32 checks right")
    assert "    64 KiB" in printed
    data = json.loads(out.read_text())
    assert data["state"] == "pass"
    assert data["sweep"]["all_reduce"]["65536"]["busbw_gbps"] > 0


def test_a_plus_in_the_work_dir_does_not_break_the_rendezvous(tmp_path: Path, torch_python: Path) -> None:
    """Cell ids carry local tags (torch2.9.1+cu130): torch reads file:// URLs and mangles '+'."""
    report = run_nccl(
        torch_python,
        world_size=2,
        backend="gloo",
        env={},
        timeouts=NcclTimeouts(init=60, correctness=60),
        sizes=[],
        thresholds=None,
        work_dir=tmp_path / "torch2.9.1+cu130-cell" / "nccl",
    )
    assert (report.state, report.world_size) == ("pass", 2), report.reason
