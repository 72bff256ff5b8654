"""Run a compat suite (compatlab/incell/suites/test_<name>.py) with the cell's own interpreter; read its verdict."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from compatlab import envs, uv_failures
from compatlab.incell.causes import CAUSES
from compatlab.incell.context import PreviousStage, SuiteContext, TargetInfo
from compatlab.proc import default_cache_dir, incell_path
from compatlab.runs.model import StageResult, StageState
from compatlab.runs.records.suite import SuiteDetails
from compatlab.stages.base import CellContext, cell_env
from compatlab.stages.bytecode import bytecode_env

__all__ = ["ensure_pytest", "run_suite", "suite_context", "tools_overlay"]

log = logging.getLogger(__name__)


def suite_context(ctx: CellContext) -> SuiteContext:
    """What a compat test may know about its cell (context.json)."""
    return SuiteContext(
        cell=ctx.cell.id,
        axes=ctx.cell.axes,
        cuda=ctx.cell.cuda,
        packages={v.package: v.version for v in ctx.cell.packages if v.package},
        site_packages=str(ctx.site),
        venv=str(ctx.venv),
        work_dir=str(ctx.work_dir),
        # Kept across runs: beside the venvs for a matrix cell (pruned with them), else the lab's cache.
        keep=str(ctx.caches / ".import-order" if ctx.caches is not None else default_cache_dir() / "import-order"),
        archs=tuple(ctx.matrix.archs),
        targets=tuple(
            TargetInfo(
                name=t.name,
                gpu=t.gpu,
                arch=tuple(t.arch),
                gpus=t.gpus,
                min_driver=t.min_driver,
                nccl_env=dict(t.nccl_env),
                not_needed=tuple(t.not_needed),
            )
            for t in ctx.matrix.targets
        ),
        thresholds=ctx.matrix.thresholds.for_suites(),
        previous={s.name: PreviousStage(state=s.state.value, reason=s.reason) for s in ctx.previous},
    )


def _requirement_closure(root: str) -> list[importlib.metadata.Distribution]:
    """*root*'s distribution and what it requires, as installed beside the lab (markers of this Python)."""
    seen: dict[str, importlib.metadata.Distribution] = {}
    todo = [root]
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        dist = importlib.metadata.distribution(name)
        seen[name] = dist
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return list(seen.values())


def tools_overlay(cache: Path | None = None) -> Path:
    """A folder outside every checked environment holding the lab's own pytest and what it requires (their
    files copied from the lab's site-packages, made once per set of versions): how ``compatlab check`` runs a
    suite in an environment without pytest and leaves it byte for byte as it found it. LabError when the
    lab's environment has no pytest (compatlab requires it)."""
    from compatlab.errors import LabError

    try:
        dists = _requirement_closure("pytest")
    except importlib.metadata.PackageNotFoundError as exc:
        raise LabError(
            f"the lab's own environment lacks {exc.args[0]}, which compatlab requires: reinstall compatlab"
        ) from None
    tag = "-".join(sorted(f"{canonicalize_name(d.metadata['Name'])}{d.version}" for d in dists))
    root = cache or default_cache_dir()
    dest = root / "tools" / tag
    if (dest / ".complete").exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tools-", dir=dest.parent))
    try:
        for dist in dists:
            for rel in dist.files or []:
                parts = rel.parts
                if not parts or parts[0] == ".." or parts[0].endswith(".dist-info") or "__pycache__" in parts:
                    continue
                src = Path(str(dist.locate_file(rel)))
                if src.is_file():
                    out = tmp.joinpath(*parts)
                    out.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(src, out)
        (tmp / ".complete").write_text(tag + "\n", encoding="utf-8")
        os.replace(tmp, dest)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if not (dest / ".complete").exists():  # another run made it first: fine
            raise LabError(f"cannot write the tools overlay {dest}: {exc.strerror or exc}") from None
    return dest


def ensure_pytest(ctx: CellContext, timeout: float = 600.0) -> StageResult | None:
    """Add pytest to the cell's venv; an error result if that fails or changes the stack."""
    from compatlab.proc import run

    before = envs.parse_freeze(ctx.freeze)
    # A venv that already sees pytest (an earlier suite added it, or a GPU box's system packages) needs
    # nothing installed; the stack is compared all the same, every time.
    # The probe's bytecode goes where the suite's will (bytecode.py): pytest is compiled once, not twice.
    probe = bytecode_env(ctx, cell_env(ctx.venv))
    if not run([str(ctx.python), "-m", "pytest", "--version"], timeout=120, env=probe).ok:
        done = envs.uv_install_tools(ctx.python, ["pytest"], timeout=timeout)
        if not done.ok:
            return StageResult(
                name="suite-setup",
                state=StageState.ERROR,
                reason="could not add pytest to the cell's venv: " + uv_failures.last_line(done.stderr),
                details={"argv": done.argv, "stderr": done.stderr[-4000:]},
                seconds=done.seconds,
            )
    if not before:  # no freeze of the stack to compare with (a venv the lab did not install)
        return None
    after = envs.parse_freeze(envs.freeze(ctx.python).stdout.splitlines())
    changed = sorted(
        f"{name} {before[name]} -> {after.get(name, 'removed')}" for name in before if after.get(name) != before[name]
    )
    if changed:
        return StageResult(
            name="suite-setup",
            state=StageState.ERROR,
            reason="adding pytest changed the stack under test: " + "; ".join(changed),
            details={"changed": changed},
        )
    return None


def _fold(name: str, data: dict[str, Any], seconds: float) -> StageResult:
    tests: list[dict[str, Any]] = data.get("tests", [])
    failed = [t for t in tests if t["outcome"] == "failed"]
    errors = [t for t in tests if t["outcome"] == "error"]
    skipped = [t for t in tests if t["outcome"] == "skipped"]
    passed = [t for t in tests if t["outcome"] == "passed"]
    merged: dict[str, Any] = {"tests": tests}
    for t in tests:
        for key, value in (t.get("details") or {}).items():
            merged.setdefault(key, value)
    found = SuiteDetails.from_details(merged)
    details = found.to_details()

    def why(t: dict[str, Any]) -> str:
        text = t.get("reason") or (t.get("message") or "").strip().splitlines()[-1:] or [t["nodeid"]]
        return text if isinstance(text, str) else text[0]

    if failed:
        more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
        code = found.cause or ""
        return StageResult(
            name=name,
            state=StageState.FAIL,
            reason=why(failed[0]) + more,
            details=details,
            seconds=seconds,
            cause=code if code in CAUSES else "",
        )
    if errors:
        return StageResult(name=name, state=StageState.ERROR, reason=why(errors[0]), details=details, seconds=seconds)
    if not tests:
        return StageResult(
            name=name, state=StageState.ERROR, reason="the suite collected no tests", details=details, seconds=seconds
        )
    if skipped and not passed:
        return StageResult(name=name, state=StageState.SKIP, reason=why(skipped[0]), details=details, seconds=seconds)
    warnings = found.warnings or ()
    if warnings:
        more = f" (and {len(warnings) - 1} more)" if len(warnings) > 1 else ""
        return StageResult(
            name=name, state=StageState.WARN, reason=str(warnings[0]) + more, details=details, seconds=seconds
        )
    return StageResult(name=name, state=StageState.PASS, reason="", details=details, seconds=seconds)


@contextlib.contextmanager
def _progress(ctx: CellContext, name: str, env: dict[str, str]) -> Iterator[tuple[int, ...]]:
    """A pipe the suite writes its progress lines to (COMPATLAB_PROGRESS_FD), each handed to ``ctx.say``
    as it comes; nothing when the cell is quiet. The suite's own output stays in pytest.log."""
    say = ctx.say
    if say is None:
        yield ()
        return
    read_end, write_end = os.pipe()
    env["COMPATLAB_PROGRESS_FD"] = str(write_end)

    def relay() -> None:
        with os.fdopen(read_end, encoding="utf-8", errors="replace") as lines:
            for line in lines:
                say(f"{name}: {line.rstrip()}")

    reader = threading.Thread(target=relay, name=f"{name}-progress", daemon=True)
    reader.start()
    try:
        yield (write_end,)
    finally:
        os.close(write_end)  # the suite's process group is gone: the reader sees the end
        reader.join(timeout=5)


def run_suite(
    ctx: CellContext,
    name: str,
    *,
    timeout: float = 1800.0,
    required: bool = True,
    extra_env: dict[str, str] | None = None,
) -> StageResult:
    """Run the compat suite test_<name>.py inside the cell and fold its tests into one stage result."""
    start = time.monotonic()
    from compatlab.proc import run

    overlay: Path | None = None
    if ctx.tools_overlay:  # an environment without pytest of its own: the lab's, from outside it
        overlay = tools_overlay()
    elif ctx.install is None or not ctx.install.existing:  # never install into one the lab did not make
        setup = ensure_pytest(ctx)
        if setup is not None:
            return dataclasses.replace(setup, name=name, seconds=time.monotonic() - start)
    work = ctx.work_dir / name
    work.mkdir(parents=True, exist_ok=True)
    ctx_file = work / "context.json"
    ctx_file.write_text(json.dumps(suite_context(ctx).to_json(), indent=2), encoding="utf-8")
    out_file = work / "suite-result.json"
    out_file.unlink(missing_ok=True)
    shim = incell_path()
    suites = shim / "compatlab" / "incell" / "suites"
    # COMPATLAB_LAB_PID: the suite dies with this process (incell/plugin.py), and knows if it already has.
    # The environment is never written: bytecode goes to the cell's folder for it (bytecode.py), and the
    # suite's own processes (incell.proc.module_command) keep it there too.
    env = bytecode_env(ctx, cell_env(ctx.venv, {"PYTHONPATH": str(shim), "COMPATLAB_LAB_PID": str(os.getpid())}))
    if extra_env:
        env.update(extra_env)
    # The overlay goes last on sys.path (compatlab.incell.runpytest): the environment's own packages win.
    launch = ["-m", "compatlab.incell.runpytest", str(overlay)] if overlay is not None else ["-m", "pytest"]
    argv = [
        str(ctx.python),
        *launch,
        str(suites / f"test_{name}.py"),
        "--rootdir",
        str(suites),
        "--config-file",
        str(suites / "pytest.ini"),
        "-p",
        "compatlab.incell.plugin",
        "--confcutdir",
        str(suites),
        "-p",
        "no:cacheprovider",
        "-q",
        "--compatlab-context",
        str(ctx_file),
        "--compatlab-result",
        str(out_file),
    ]
    with _progress(ctx, name, env) as fds:
        done = run(argv, timeout=timeout, env=env, cwd=work, pass_fds=fds)
    (work / "pytest.log").write_text(done.stdout + "\n--- stderr ---\n" + done.stderr, encoding="utf-8")
    seconds = time.monotonic() - start
    if done.timed_out:
        return StageResult(
            name=name,
            state=StageState.FAIL,
            reason=f"the {name} suite hung: killed after {timeout:.0f} s",
            details={"argv": argv, "log": str(work / "pytest.log")},
            seconds=seconds,
            required=required,
        )
    try:
        data = json.loads(out_file.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        sig = done.signal_name
        tail = uv_failures.last_line(done.stderr or done.stdout)
        reason = (
            f"the {name} suite's interpreter died by {sig}"
            if sig
            else f"the {name} suite wrote no result (exit {done.returncode}): {tail}"
        )
        return StageResult(
            name=name,
            state=StageState.ERROR if not sig else StageState.FAIL,
            reason=reason,
            details={"argv": argv, "log": str(work / "pytest.log")},
            seconds=seconds,
            required=required,
        )
    result = _fold(name, data, seconds)
    logged = dataclasses.replace(SuiteDetails.of(result), log=str(work / "pytest.log"))
    return dataclasses.replace(result, required=required, details=logged.to_details())
