"""`compatlab check`: the lab's own pipeline on an environment that already exists, one verdict.

The stages are those of `nox -s matrix` (``stages.PIPELINE`` without ``install``, the environment being
there already; ``nccl`` of ``stages.GPU8`` when asked) and they run through the runner's one loop, so a
stage judges an existing environment exactly as it judges a cell. The environment becomes a one-cell
matrix: its axes are the stack it has (the distributions of the axis kinds: torch, sgl-kernel, flashinfer,
torchvision …, and the CUDA of torch's build), or its Python's version when it has none of them; the
cell's packages are every installed distribution with native code (RECORD lists a shared object), or the
ones asked for.

What the checked interpreter is decides what may be done to it. A virtual environment without pytest gets
pytest added for the import and cuda suites (the stack is compared before and after, as in a cell); an
interpreter that is not a virtual environment (``/usr/bin/python3``) is never installed into: without
pytest, the suites are skipped with that reason and the verdict says the question is partly unanswered.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from compatlab.cells import Cell, cell_id, planned
from compatlab.config.matrix import AXIS_KINDS, CUDA_AXIS, PYTHON_AXIS, Axis, AxisValue, Matrix, Report, Target
from compatlab.config.serve import ServeConfig
from compatlab.errors import ConfigError, LabError, UsageError
from compatlab.runs.model import CellResult, StageResult
from compatlab.stages import GPU8, PIPELINE, CellContext, Stage
from compatlab.stages.site import cuda_of_torch

__all__ = [
    "CheckRun",
    "Environment",
    "PackageRow",
    "check_environment",
    "check_stages",
    "count_gpus",
    "inspect_environment",
    "load_serve",
    "package_rows",
    "parse_pins",
]

# Runs with the checked interpreter, standard library only: who it is, and every distribution it sees.
_INSPECT = r"""
import importlib.metadata as md, importlib.util, json, sys, sysconfig
out = {"python": sys.executable, "version": "%d.%d.%d" % sys.version_info[:3], "prefix": sys.prefix,
       "base_prefix": getattr(sys, "base_prefix", sys.prefix), "purelib": sysconfig.get_paths()["purelib"],
       "platlib": sysconfig.get_paths()["platlib"], "path": sys.path,
       "pytest": importlib.util.find_spec("pytest") is not None, "pip": importlib.util.find_spec("pip") is not None,
       "dists": []}
out["problems"] = []
seen = set()
for d in md.distributions():
    # One distribution's broken METADATA or RECORD is reported for it; the others are still checked.
    where = str(getattr(d, "_path", "") or "?").rsplit("/", 1)[-1]
    try:
        name = d.metadata["Name"]
        version = d.version
    except Exception as exc:
        out["problems"].append([where, "its METADATA cannot be read (%s: %s)" % (type(exc).__name__, str(exc)[:200])])
        continue
    if not name or name.lower() in seen:
        continue  # the first on sys.path is the one `import` finds
    seen.add(name.lower())
    native = []
    try:
        files = list(d.files or ())
    except Exception as exc:
        out["problems"].append([where, "its RECORD cannot be read (%s: %s); its files were not checked"
                                % (type(exc).__name__, str(exc)[:200])])
        files = []
    for f in files:
        s = str(f)
        if (s.endswith(".so") or ".so." in s.rsplit("/", 1)[-1]) and not s.startswith(".."):
            native.append(s)
    try:
        site = str(d.locate_file(""))
    except Exception:
        site = ""
    out["dists"].append({"name": name, "version": version, "native": len(native), "site": site})
try:  # torch/version.py says which CUDA it was built for, without importing torch
    out["torch_version_py"] = open(md.distribution("torch").locate_file("torch/version.py"), encoding="utf-8").read()
except Exception:
    out["torch_version_py"] = None
print(json.dumps(out))
"""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Environment:
    """An interpreter and what it sees, read by running it once."""

    python: Path
    version: str
    prefix: Path
    is_venv: bool
    site: Path  # the site directory holding most of the distributions with native code
    dists: dict[str, str]  # name as its METADATA spells it -> version
    native: tuple[str, ...]  # distributions whose RECORD lists a shared object
    sites: dict[str, str]  # distribution -> the site directory it is installed in
    has_pytest: bool
    has_pip: bool
    torch_version_py: str | None = None
    # (the *.dist-info folder, what is wrong with it): distributions whose METADATA or RECORD cannot be read
    problems: tuple[tuple[str, str], ...] = ()

    def version_of(self, name: str) -> str | None:
        want = _canon(name)
        return next((v for d, v in self.dists.items() if _canon(d) == want), None)

    def site_for(self, names: Sequence[str]) -> Path:
        """The site directory holding most of *names* (the static stage reads one site directory)."""
        counts: dict[str, int] = {}
        for name in names:
            site = self.sites.get(self.spelled(name) or name, "")
            if site:
                counts[site] = counts.get(site, 0) + 1
        return Path(max(counts, key=lambda s: counts[s])) if counts else self.site

    def spelled(self, name: str) -> str | None:
        want = _canon(name)
        return next((d for d in self.dists if _canon(d) == want), None)


def _canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def inspect_environment(python: Path) -> Environment:
    """Run *python* once and read what it is and sees. UsageError when it is not a usable interpreter."""
    from compatlab.proc import run

    if not python.exists():
        raise UsageError(f"{python}: no such interpreter; pass --python PATH or --venv DIR of the environment")
    try:
        done = run([str(python), "-I", "-c", _INSPECT], timeout=120, env=_plain_env())
    except OSError as exc:
        raise UsageError(f"{python}: cannot run it: {exc.strerror or exc}") from None
    if not done.ok:
        last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        raise UsageError(f"{python}: could not read its environment: {last}")
    info = json.loads(done.stdout)
    dists = {d["name"]: d["version"] for d in info["dists"]}
    native = tuple(sorted((d["name"] for d in info["dists"] if d["native"]), key=str.lower))
    sites = {d["name"]: d["site"] for d in info["dists"]}
    counts: dict[str, int] = {}
    for d in info["dists"]:
        if d["native"] and d["site"]:
            counts[d["site"]] = counts.get(d["site"], 0) + 1
    site = max(counts, key=lambda s: counts[s]) if counts else info["purelib"]
    return Environment(
        python=Path(info["python"] or python),
        version=info["version"],
        prefix=Path(info["prefix"]),
        is_venv=info["prefix"] != info["base_prefix"],
        site=Path(site),
        dists=dists,
        native=native,
        sites=sites,
        has_pytest=bool(info["pytest"]),
        has_pip=bool(info["pip"]),
        torch_version_py=info.get("torch_version_py"),
        problems=tuple(sorted((str(w), str(why)) for w, why in info.get("problems", []))),
    )


def _plain_env() -> dict[str, str]:
    dropped = ("PYTHONPATH", "PYTHONHOME", "LD_PRELOAD")
    return {k: v for k, v in os.environ.items() if k not in dropped}


def parse_pins(pins: Sequence[str], constraints: Path | None = None) -> dict[str, str]:
    """``NAME==VERSION`` pins from the command line and a constraints file: {name: version}.

    A pin is what the pins stage compares against, so only exact pins are taken; anything else is a
    UsageError (ConfigError for a line of the file) that names the pin and the fix.
    """
    from packaging.requirements import InvalidRequirement, Requirement

    out: dict[str, str] = {}
    problems: list[str] = []

    def take(text: str, where: str) -> str | None:
        try:
            req = Requirement(text)
        except InvalidRequirement as exc:
            return f"{where}: {text!r} is not a requirement ({exc}); expected NAME==VERSION, e.g. torch==2.9.1"
        specs = list(req.specifier)
        if len(specs) != 1 or specs[0].operator not in ("==", "===") or "*" in specs[0].version:
            return f"{where}: {text!r} is not a pin; expected NAME==VERSION, e.g. {req.name}==2.9.1"
        out[req.name] = specs[0].version
        return None

    for pin in pins:
        problem = take(pin, "--pin")
        if problem:
            raise UsageError(problem)
    if constraints is not None:
        try:
            lines = constraints.read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise UsageError(f"--constraints {constraints}: cannot read it: {exc.strerror or exc}") from None
        for number, raw in enumerate(lines, 1):
            line = raw.split("#", 1)[0].strip()
            if not line or line.startswith("-"):
                continue  # empty, a comment, or a pip option (-c, --index-url): not a pin
            problem = take(line, f"line {number}")
            if problem:
                problems.append(problem)
        if problems:
            raise ConfigError(str(constraints), problems)
    return out


def count_gpus() -> int:
    """NVIDIA GPUs this machine has, from the driver's /proc entries (else nvidia-smi -L); 0 without a driver."""
    proc = Path("/proc/driver/nvidia/gpus")
    if proc.is_dir():
        return sum(1 for _ in proc.iterdir())
    import shutil

    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    from compatlab.proc import run

    try:
        done = run([smi, "-L"], timeout=60)
    except OSError:
        return 0
    return sum(1 for line in done.stdout.splitlines() if line.startswith("GPU ")) if done.ok else 0


def _stack_values(env: Environment, pins: dict[str, str]) -> list[AxisValue]:
    """The axes of the grid: the stack packages the environment has (pinned ones at their pin)."""
    values: list[AxisValue] = []
    for axis, kind in AXIS_KINDS.items():
        if kind.package is None:
            continue
        spelled = env.spelled(kind.package)
        pinned = next((v for n, v in pins.items() if _canon(n) == _canon(kind.package)), None)
        if spelled is None and pinned is None:
            continue
        version = pinned or env.dists[spelled or kind.package]
        values.append(AxisValue(axis=axis, version=version, package=spelled or kind.package))
    return values


def plan_cell(
    env: Environment,
    *,
    packages: Sequence[str] = (),
    pins: dict[str, str] | None = None,
    archs: Sequence[str] = (),
    min_driver: str | None = None,
    gpus: int = 0,
    not_needed: Sequence[str] = (),
) -> tuple[Matrix, Cell]:
    """The one-cell matrix of an existing environment, and its cell.

    The cell's packages are *packages* (every distribution with native code when empty), the pinned
    ones and the stack; a pinned one carries its pin as the declared version, so that the pins stage
    compares the environment against it.
    """
    pins = dict(pins or {})
    if packages:
        unknown = [p for p in packages if env.spelled(p) is None]
        if unknown:
            raise UsageError(
                f"--package {unknown[0]}: not installed for {env.python}"
                + (f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else "")
                + "; `compatlab check` without --package checks every distribution with native code"
            )
        chosen = [env.spelled(p) or p for p in packages]
    else:
        chosen = list(env.native)
    stack = _stack_values(env, pins)
    cuda = cuda_of_torch(env.torch_version_py, env.version_of("torch"))
    axis_values = list(stack)
    if cuda:
        axis_values.append(AxisValue(axis=CUDA_AXIS, version=cuda))
    if not axis_values:
        axis_values.append(AxisValue(axis=PYTHON_AXIS, version=env.version))
    in_stack = {_canon(v.package) for v in stack if v.package}
    extra: list[AxisValue] = []
    for name in [*chosen, *pins]:
        if _canon(name) in in_stack or any(_canon(name) == _canon(v.axis) for v in extra):
            continue
        pinned = next((v for n, v in pins.items() if _canon(n) == _canon(name)), None)
        version = pinned or env.version_of(name)
        if version is None:  # a pin of something not installed: the pins stage says so
            version = "?"
        extra.append(AxisValue(axis=name, version=version, package=env.spelled(name) or name))
    target = Target(
        name="this-box", arch=tuple(archs), gpus=max(1, gpus), min_driver=min_driver, not_needed=tuple(not_needed)
    )
    rows = (axis_values[0].axis,)
    columns = tuple(v.axis for v in axis_values[1:] if v.axis != CUDA_AXIS)
    matrix = Matrix(
        path="<compatlab check>",
        name=f"check {env.prefix}",
        axes=tuple(Axis(name=v.axis, values=(v,)) for v in axis_values),
        targets=(target,),
        report=Report(rows=rows, columns=columns, tables=(CUDA_AXIS,) if cuda else ()),
    )
    cell = Cell(id=cell_id(tuple(axis_values)), values=(*axis_values, *extra))
    return matrix, cell


def _suites_cannot_run(env: Environment, stage: Stage) -> Stage:
    """The import and cuda suites need pytest; a Python that is not a venv is never installed into."""
    if env.has_pytest or env.is_venv or stage.name not in ("import", "cuda"):
        return stage
    reason = (
        f"{env.python} is not a virtual environment and has no pytest, which the {stage.name} suite runs "
        "with; compatlab check installs nothing into it: install pytest for that interpreter "
        f"({env.python} -m pip install pytest, or the distribution's python3-pytest), or check a venv"
    )
    required = stage.required

    def skipped(_ctx: CellContext) -> StageResult:
        return StageResult(name=stage.name, state="skip", reason=reason, required=required)

    return dataclasses.replace(stage, run=skipped)


def load_serve(path: Path) -> ServeConfig:
    """The ``[serve]`` table of a TOML file (a matrix.toml will do): what ``check --serve-from`` serves."""
    import tomllib

    from compatlab.config.check import Checker
    from compatlab.config.serve import parse_serve_section

    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--serve-from {path}: cannot read it: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(str(path), [f"invalid TOML: {exc}"]) from None
    ck = Checker()
    config = parse_serve_section(ck, ck.table(data, "", "serve"), path.resolve().parent)
    ck.raise_if_any(str(path))
    return config


def check_stages(env: Environment, *, nccl: bool = False, only: Sequence[str] = ()) -> tuple[Stage, ...]:
    """The matrix's stages without ``install`` (its need dropped: the environment is there), nccl if asked;
    only those named in *only* when it is given."""
    chosen = [s for s in PIPELINE if s.name != "install"]
    if nccl or "nccl" in only:
        chosen += [s for s in GPU8 if s.name == "nccl"]
    if only:
        chosen = [s for s in chosen if s.name in only]
    out = []
    for stage in chosen:
        bare = dataclasses.replace(stage, needs=tuple(n for n in stage.needs if n != "install"))
        out.append(_suites_cannot_run(env, bare))
    return tuple(out)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class PackageRow:
    """One checked distribution: its modules and what each stage said of them."""

    name: str
    version: str
    state: str  # fail | warn | pass
    modules: int
    messages: tuple[str, ...]  # failures first, then warnings

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "state": self.state,
            "modules": self.modules,
            "messages": list(self.messages),
        }


@dataclasses.dataclass(kw_only=True, slots=True)
class CheckRun:
    environment: Environment
    matrix: Matrix
    result: CellResult
    packages: list[PackageRow]
    files: list[Path] = dataclasses.field(default_factory=list)


def check_environment(
    env: Environment,
    *,
    out: Path,
    packages: Sequence[str] = (),
    pins: dict[str, str] | None = None,
    archs: Sequence[str] = (),
    min_driver: str | None = None,
    nccl: bool = False,
    gpus: int | None = None,
    run_id: str | None = None,
    on_stage: Callable[[StageResult], None] | None = None,
    only: Sequence[str] = (),
    serve: ServeConfig | None = None,
    say: Callable[[str], None] | None = None,
) -> CheckRun:
    """Run the check's stages on *env* through the runner's loop, and write the report files into *out*.

    The run folder is ``out/runs/<run-id>/`` as for a matrix run (the cell's work files in
    ``cells/<id>/``); *out* gets the grid of the one cell (index.html, compat.md, results.json) and the
    per-package table (packages.md, packages.json).
    """
    from compatlab import runner
    from compatlab.host import host_facts
    from compatlab.render import render_run
    from compatlab.runs import store

    ngpus = count_gpus() if gpus is None else gpus
    matrix, cell = plan_cell(env, packages=packages, pins=pins, archs=archs, min_driver=min_driver, gpus=ngpus)
    if serve is not None:
        matrix = dataclasses.replace(matrix, serve=serve)
    rid = run_id or runner.new_run_id()
    run_dir = out / "runs" / rid
    axes = {a.name: a.values[0].version for a in matrix.axes}
    result = CellResult(id=cell.id, axes=axes, state="n/a", started=runner.now_iso())
    stages = check_stages(env, nccl=nccl, only=only)
    if on_stage is not None:
        stages = tuple(dataclasses.replace(s, run=_reporting(s.run, on_stage)) for s in stages)
    with store.claim_run(run_dir, run_id=rid, plan=planned(matrix), host=host_facts) as run:
        site = env.site_for([v.package for v in cell.packages if v.package])
        ctx = CellContext(
            matrix=matrix,
            cell=cell,
            venv=env.prefix,
            python=env.python,
            work_dir=run.work_dir(cell.id),
            site_packages=site,
            freeze=_freeze_before_pytest(env),
            install={"existing": str(env.prefix), "python": str(env.python)},
            previous=result.stages,
            say=say,
        )
        t0 = time.monotonic()
        runner.run_pipeline(ctx, result, stages)
        result.seconds = round(time.monotonic() - t0, 3)
        written = [run.write_cell(result)]
        run.aggregate(planned(matrix), latest=None)
    written += render_run(run_dir / "results.json", out, history_dir=None)
    rows = package_rows(result, cell) + [
        PackageRow(name=where, version="?", state="warn", modules=0, messages=(f"metadata: {why}",))
        for where, why in env.problems
    ]
    check = CheckRun(environment=env, matrix=matrix, result=result, packages=rows)
    md = out / "packages.md"
    md.write_text(_packages_md(check.packages), encoding="utf-8")
    js = out / "packages.json"
    js.write_text(
        json.dumps(
            {"cell": result.id, "state": str(result.state), "packages": [r.to_json() for r in check.packages]}, indent=2
        )
        + "\n",
        encoding="utf-8",
    )
    check.files = [*written, md, js]
    return check


def _freeze_before_pytest(env: Environment) -> list[str]:
    """What the suites compare the stack with after adding pytest to a venv that lacks it (as uv lists it,
    which is how they list it after); nothing when pytest is there already, since nothing is installed."""
    if env.has_pytest or not env.is_venv:
        return []
    from compatlab import envs

    done = envs.freeze(env.python)
    if not done.ok:
        raise LabError(f"cannot list the packages of {env.python} before adding pytest: {envs.last_line(done.stderr)}")
    return done.stdout.splitlines()


def _reporting(
    run: Callable[[CellContext], StageResult], told: Callable[[StageResult], None]
) -> Callable[[CellContext], StageResult]:
    def wrapped(ctx: CellContext) -> StageResult:
        out = run(ctx)
        told(out)
        return out

    return wrapped


def package_rows(result: CellResult, cell: Cell) -> list[PackageRow]:
    """The per-package table: each checked distribution's modules and the findings that name it."""
    names = {_canon(v.package): v for v in cell.packages if v.package}
    fails: dict[str, list[str]] = {n: [] for n in names}
    warns: dict[str, list[str]] = {n: [] for n in names}
    modules: dict[str, set[str]] = {n: set() for n in names}
    for stage in result.stages:
        if stage.name == "static":
            for f in stage.details.get("findings", []):
                dist = _canon(str(f.get("details", {}).get("dist") or ""))
                if dist in names and f.get("severity") in ("fail", "warn"):
                    (fails if f["severity"] == "fail" else warns)[dist].append(f"static: {f['message']}")
            for dist, mods in (stage.details.get("modules_by_dist") or {}).items():
                if _canon(dist) in modules:
                    modules[_canon(dist)].update(mods)
        elif stage.name == "import":
            for entry in stage.details.get("modules", []):
                dist = _canon(str(entry.get("dist") or ""))
                if dist not in names:
                    continue
                if entry.get("module", "").endswith(".so"):
                    modules[dist].add(entry["module"])
                if entry.get("failure") and entry.get("reason"):
                    bucket = warns if entry.get("needed") is False else fails
                    if entry["failure"].get("kind") == "missing-dependency":
                        bucket = warns
                    bucket[dist].append(f"import: {entry.get('verdict') or entry['reason']}")
        for msg in stage.details.get("failures", []) if stage.name == "pins" else []:
            for n, value in names.items():
                if str(msg).lower().startswith(f"{value.package} ".lower()):
                    fails[n].append(f"pins: {msg}")
    rows = []
    for n, value in names.items():
        state = "fail" if fails[n] else "warn" if warns[n] else "pass"
        rows.append(
            PackageRow(
                name=value.package or n,
                version=value.version,
                state=state,
                modules=len(modules[n]),
                messages=tuple(fails[n] + warns[n]),
            )
        )
    order = {"fail": 0, "warn": 1, "pass": 2}
    rows.sort(key=lambda r: (order[r.state], r.name.lower()))
    return rows


def _packages_md(rows: Sequence[PackageRow]) -> str:
    lines = ["| package | version | state | modules | what |", "| --- | --- | --- | --- | --- |"]
    for r in rows:
        what = "<br>".join(m.replace("|", "\\|") for m in r.messages) or ""
        lines.append(f"| {r.name} | {r.version} | {r.state} | {r.modules} | {what} |")
    return "\n".join(lines) + "\n"
