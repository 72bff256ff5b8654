"""The serve stage against a real process that speaks SGLang's launch CLI and HTTP protocol.

The venv is real (fixtures.fakesglang): its ``python -m sglang.launch_server`` checks the model folder
the stage made, then serves (the perf stand-in) or fails as SGLang does (a traceback in the launcher, or
the scheduler's "Scheduler hit an exception" followed by the launcher's SIGKILL of its tree), as
``STANDIN_SGLANG_FAULT`` asks. A stand-in ``nvidia-smi`` stands for the GPU this machine lacks.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from compatlab.cells import expand
from compatlab.config.matrix import parse_matrix
from compatlab.runs.model import StageState
from compatlab.stages.base import CellContext
from compatlab.stages.serve.stage import run_serve_stage
from compatlab.stages.sglang.server import group_members, port_is_free
from fixtures.fakesglang import fake_sglang_venv

FAKE = Path(__file__).resolve().parents[1] / "fixtures" / "fake_sglang"


def _line(rel: str, text: str) -> int:
    """The stand-in's line that a traceback names: the first holding *text* (so that its layout may change)."""
    lines = (FAKE / rel).read_text(encoding="utf-8").splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


SRC = Path(__file__).resolve().parents[2] / "src"
MATRIX = """
[[axes.torch]]
version = "2.11.0"
[[axes.sglang]]
version = "0.5.17"
[[axes.cuda]]
version = "13.0"
[targets.h200]
gpus = 8
[serve]
output-len = 24
requests = 2
startup-timeout = {timeout}
"""


@pytest.fixture(scope="module")
def gpu_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fake_sglang_venv(tmp_path_factory.mktemp("serve"))


def _context(tmp_path: Path, venv: Path, *, timeout: float = 60) -> CellContext:
    matrix = parse_matrix(tomllib.loads(MATRIX.format(timeout=timeout)), str(tmp_path / "matrix.toml"))
    site = next(venv.glob("lib/python3*/site-packages"))
    return CellContext(
        matrix=matrix,
        cell=expand(matrix)[0],
        venv=venv,
        python=venv / "bin" / "python",
        site_packages=site,
        work_dir=tmp_path / "cell",
    )


def test_both_servers_serve_and_are_gone_after(tmp_path: Path, gpu_venv: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STANDIN_SGLANG_FAULT", raising=False)
    # A cache of its own: a test beside it serving the same stack would hold the stack's JIT cache (a note).
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    stage = run_serve_stage(_context(tmp_path, gpu_venv))
    assert stage.state == StageState.PASS, stage.reason
    assert stage.reason.startswith("SGLang 0.5.17 serves LlamaForCausalLM (4 layers, tp 1, dummy weights): baseline ")
    details = stage.details
    assert details["notes"] == ["the target has 8 GPUs, this machine 1: served with --tp-size 1"]
    assert details["gpus"] == [{"index": 0, "name": "NVIDIA H200", "arch": "sm_90", "memory_mib": 143771}]
    servers = details["servers"]
    assert [servers[n]["speculative_algorithm"] for n in ("baseline", "eagle3")] == [None, "EAGLE3"]
    figures = details["figures"]
    for name in ("baseline", "eagle3"):
        assert figures[f"{name}_gpu_memory_mib"] == 1234  # the launcher's one process, as nvidia-smi lists it
        assert figures[f"{name}_tok_s_c1"] > 0
        assert figures[f"{name}_tok_s_c8"] > 0
        assert figures[f"{name}_startup_s"] >= 0.3  # the stand-in's warm-up: health answers 503 until then
        assert group_members(servers[name]["pid"]) == []
        assert port_is_free(servers[name]["port"])
    # Read before /flush_cache, which resets it (issue 31): the figure /server_info reported.
    assert (figures["eagle3_accept_length"] or 0) > 1.0, servers["eagle3"]
    assert servers["eagle3"]["accept_length_source"] == "/server_info"
    argv_log = (tmp_path / "cell" / "serve" / "logs" / "eagle3.log").read_text(encoding="utf-8")
    assert "speculative_algorithm='EAGLE3'" in argv_log
    draft = json.loads((tmp_path / "cell" / "serve" / "model" / "draft" / "config.json").read_text(encoding="utf-8"))
    assert draft["architectures"] == ["LlamaForCausalLMEagle3"]


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        (
            "ipython",
            (
                "fail",
                "baseline server: ModuleNotFoundError: No module named 'IPython' (imported by "
                f"sglang/utils.py:{_line('sglang/utils.py', 'from IPython')}); eagle3 server not started: the "
                "baseline failed at start-up (import), before the model loads, where EAGLE-3 starts the same way",
            ),
        ),
        (
            "no-kernel-image",
            (
                "fail",
                "both servers: no kernel image for sm_90 in sgl_kernel (in "
                f"sgl_kernel/elementwise.py:{_line('sgl_kernel/elementwise.py', 'raise RuntimeError(')}): "
                "RuntimeError: CUDA error: no kernel image is available for execution on the device",
            ),
        ),
        (
            "graph",
            (
                "fail",
                "both servers: CUDA graph capture failed: no kernel image for sm_90 in sgl_kernel (in "
                f"sgl_kernel/elementwise.py:{_line('sgl_kernel/elementwise.py', 'raise RuntimeError(')}): "
                "RuntimeError: CUDA error: no kernel image is available for "
                "execution on the device",
            ),
        ),
        (
            "oom",
            (
                "error",
                "baseline server: out of GPU memory (in "
                f"sglang/launch_server.py:{_line('sglang/launch_server.py', 'raise OutOfMemoryError(')}): "
                "torch.OutOfMemoryError: "
                "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 139.81 GiB of "
                "which 1.06 GiB is free.",
            ),
        ),
    ],
)
def test_a_failed_start_names_its_cause(
    tmp_path: Path, gpu_venv: Path, monkeypatch: pytest.MonkeyPatch, fault: str, expected: tuple[str, str]
) -> None:
    monkeypatch.setenv("STANDIN_SGLANG_FAULT", fault)
    stage = run_serve_stage(_context(tmp_path, gpu_venv))
    assert (stage.state, stage.reason) == expected
    state = expected[0]
    assert stage.details["figures"] == {}
    started = ["baseline", "eagle3"] if state == "fail" else ["baseline"]  # an error stops: it would recur
    assert list(stage.details["servers"]) == started
    # A baseline that fails before the model loads (an import) does not pay SGLang's import twice (issue 31).
    eagle3 = stage.details["servers"].get("eagle3", {})
    assert (eagle3.get("state") == StageState.SKIP) == (fault == "ipython"), eagle3
    assert ("log" in eagle3) == (fault not in ("ipython", "oom")), eagle3


def test_a_server_that_never_becomes_healthy_is_an_error(
    tmp_path: Path, gpu_venv: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STANDIN_SGLANG_FAULT", "never-healthy")
    stage = run_serve_stage(_context(tmp_path, gpu_venv, timeout=2))
    assert stage.state == StageState.ERROR
    assert stage.reason.startswith("baseline server did not become healthy within 2 s (/health_generate on port ")
    assert "its log's last line: " in stage.reason
    assert list(stage.details["servers"]) == ["baseline"]


def test_without_a_gpu_it_does_not_start_sglang_and_says_so(tmp_path: Path) -> None:
    venv = fake_sglang_venv(tmp_path, gpu=False)
    if any((Path(d) / "nvidia-smi").exists() for d in os.environ.get("PATH", "").split(os.pathsep) if d):
        pytest.skip("this machine has an nvidia-smi")
    stage = run_serve_stage(_context(tmp_path, venv))
    assert (stage.state, stage.required, stage.reason) == (
        "skip",
        True,
        "skipped: no NVIDIA GPU on this machine (no nvidia-smi on PATH); SGLang 0.5.17 was not started",
    )


def test_a_cell_without_sglang_has_nothing_to_serve(tmp_path: Path) -> None:
    venv = fake_sglang_venv(tmp_path)
    for meta in venv.glob("lib/python3*/site-packages/sglang-*.dist-info"):
        for f in meta.iterdir():
            f.unlink()
        meta.rmdir()
    stage = run_serve_stage(_context(tmp_path, venv))
    assert (stage.state, stage.required, stage.reason) == (
        "skip",
        False,
        "skipped: the cell has no SGLang to serve with",
    )
    # A FIFO named METADATA (a hostile wheel) is never opened: reading it would block for ever.
    fifo_info = next(venv.glob("lib/python3*/site-packages")) / "sglang-0.5.17.dist-info"
    fifo_info.mkdir()
    os.mkfifo(fifo_info / "METADATA")
    stage = run_serve_stage(_context(tmp_path, venv))
    assert (stage.state, stage.reason) == ("skip", "skipped: the cell has no SGLang to serve with")


def test_compatlab_check_serves_with_relative_paths(tmp_path: Path, gpu_venv: Path) -> None:
    (tmp_path / "serve.toml").write_text(
        "[serve]\noutput-len = 16\nrequests = 1\nconcurrency = [1, 2]\n", encoding="utf-8"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "STANDIN_SGLANG_FAULT")}
    env["PYTHONPATH"] = str(SRC)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "compatlab",
            "check",
            "--venv",
            str(gpu_venv),
            "--stage",
            "serve",
            "--serve-from",
            "serve.toml",
            "--out",
            "reports/box",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    [cell] = json.loads((tmp_path / "reports" / "box" / "results.json").read_text(encoding="utf-8"))["cells"]
    assert [s["name"] for s in cell["stages"]] == ["serve"]
    serve = cell["stages"][0]
    assert serve["state"] == "pass", serve["reason"]
    assert serve["reason"].startswith(
        "SGLang 0.5.17 serves LlamaForCausalLM (4 layers, tp 1, dummy weights): baseline "
    )
    assert " c2 (start-up " in serve["reason"]
    assert "  serve: pass (" in done.stdout


def test_the_jit_cache_is_the_stack_s_and_paid_once(
    tmp_path: Path, gpu_venv: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 35: what SGLang compiles at start lives in one folder per exact stack, driver and arch, shared by
    the two servers and kept between runs that ended well; one a failed run left is never used."""
    monkeypatch.delenv("STANDIN_SGLANG_FAULT", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no cache of this user's in the way
    first = run_serve_stage(_context(tmp_path / "one", gpu_venv))
    assert first.state == StageState.PASS, first.reason
    cache = first.details["jit_cache"]
    assert (cache["reused_files"], cache["compiled_files"], cache["kept"]) == (0, 3, True)
    root = Path(cache["path"])
    assert root.parent == tmp_path / "home" / ".cache" / "compatlab" / "jit"  # no venvs folder: $COMPATLAB_CACHE
    # The baseline compiled, EAGLE-3 took them from the cache: in the servers' own logs.
    logs = tmp_path / "one" / "cell" / "serve" / "logs"
    assert "Triton kernels: 3 compiled, 0 from " in (logs / "baseline.log").read_text(encoding="utf-8")
    assert "Triton kernels: 0 compiled, 3 from " in (logs / "eagle3.log").read_text(encoding="utf-8")

    # A matrix cell's: in its venvs folder, whatever run's venv it is.
    kept = run_serve_stage(dataclasses.replace(_context(tmp_path / "venvs-run", gpu_venv), caches=tmp_path / "venvs"))
    assert Path(kept.details["jit_cache"]["path"]).parent == tmp_path / "venvs" / ".jit-cache"

    second = run_serve_stage(_context(tmp_path / "two", gpu_venv))
    assert second.state == StageState.PASS, second.reason
    again = second.details["jit_cache"]
    assert (again["path"], again["reused_files"], again["compiled_files"]) == (str(root), 3, 0)
    assert second.details["figures"]["jit_cache_reused_files"] == 3

    # A cache folder that cannot be made costs the JIT again, never the verdict.
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("", encoding="utf-8")
    monkeypatch.setenv("COMPATLAB_CACHE", str(blocked))
    uncached = run_serve_stage(_context(tmp_path / "uncached", gpu_venv))
    assert uncached.state == StageState.PASS, uncached.reason
    assert "jit_cache" not in uncached.details
    assert any(n.startswith(f"no JIT cache ({blocked}/jit: ") for n in uncached.details["notes"]), uncached.details
    monkeypatch.delenv("COMPATLAB_CACHE")

    # A run that fails drops its cache; the next one starts from nothing, never from what a failure left.
    monkeypatch.setenv("STANDIN_SGLANG_FAULT", "no-kernel-image")
    failed = run_serve_stage(_context(tmp_path / "three", gpu_venv))
    assert failed.state == StageState.FAIL
    assert failed.details["jit_cache"]["kept"] is False
    assert not root.exists()


def test_a_second_run_of_the_same_stack_leaves_the_first_ones_jit_cache_alone(
    tmp_path: Path, gpu_venv: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two checks of one environment at once: the second emptied the first's cache folder as unfinished (its
    stamp is removed while its servers run) and the first then crashed writing its stamp (seen with the e2e
    suite on 3 workers). A run that finds the folder held compiles in one of its own and keeps nothing."""
    monkeypatch.delenv("STANDIN_SGLANG_FAULT", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    first = run_serve_stage(_context(tmp_path / "one", gpu_venv))
    assert first.state == StageState.PASS, first.reason
    root = Path(first.details["jit_cache"]["path"])
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    with open(root.with_name(root.name + ".lock"), "a") as held:  # as another run's serve stage holds it
        fcntl.flock(held, fcntl.LOCK_EX)
        second = run_serve_stage(_context(tmp_path / "two", gpu_venv))
    assert second.state == StageState.PASS, second.reason
    cache = second.details["jit_cache"]
    assert (cache["busy"], cache["kept"], cache["reused_files"], cache["compiled_files"]) == (True, False, 0, 3)
    assert Path(cache["path"]).parent == root.parent
    assert not Path(cache["path"]).exists()  # its own folder is gone
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before  # the held one is as it was
    assert any("in use by another run of this very stack" in n for n in second.details["notes"])
    # A busy run killed while serving left its folder: the next serve stage there removes it, never one that
    # a run still holds (nor one made a moment ago, which its run may not have locked yet).
    stale, live, young = (root.with_name(f".{root.name}-busy-{n}") for n in ("stale", "live", "young"))
    for folder in (stale, live, young):
        (folder / "triton").mkdir(parents=True)
        (folder / "triton" / "kernel.bin").write_bytes(b"\0")
    for folder in (stale, live):
        os.utime(folder, (time.time() - 600, time.time() - 600))
    held_fd = os.open(live, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(held_fd, fcntl.LOCK_EX)
        third = run_serve_stage(_context(tmp_path / "three", gpu_venv))  # released: the stack's cache again
    finally:
        os.close(held_fd)
    assert (third.details["jit_cache"]["path"], third.details["jit_cache"]["reused_files"]) == (str(root), 3)
    assert (stale.exists(), live.exists(), young.exists()) == (False, True, True)
    assert third.details["jit_cache"]["swept"] == 1
    assert (
        f"removed 1 JIT cache folder(s) that runs killed while serving left under {root.parent}"
        in (third.details["notes"])
    )


def test_the_servers_bytecode_is_compiled_once_outside_the_environment(
    tmp_path: Path, gpu_venv: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 35: on a box that writes no bytecode (PYTHONDONTWRITEBYTECODE, as many images set), every server
    process compiled SGLang from source at each start. Its bytecode now goes to the stack's folder outside
    the environment, written by the first server and read by the next and by the next run."""
    monkeypatch.delenv("STANDIN_SGLANG_FAULT", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    site = next(gpu_venv.glob("lib/python3*/site-packages"))
    first = run_serve_stage(_context(tmp_path / "one", gpu_venv))
    assert first.state == StageState.PASS, first.reason
    [folder] = (tmp_path / "home" / ".cache" / "compatlab" / "bytecode").iterdir()
    [pyc] = (folder / site.resolve().relative_to("/") / "sglang").glob("launch_server.*.pyc")
    written = pyc.stat().st_mtime_ns
    assert not list(site.rglob("__pycache__")), "the environment must not be written"

    second = run_serve_stage(_context(tmp_path / "two", gpu_venv))
    assert second.state == StageState.PASS, second.reason
    assert pyc.stat().st_mtime_ns == written
    assert not list(site.rglob("__pycache__"))
