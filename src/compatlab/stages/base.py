"""The stage interface: each stage reads a CellContext and returns a StageResult.

Also what every stage that runs code in the cell shares: the cell's environment (``cell_env``), the
folder that holds ``compatlab.incell`` alone (``incell_path``), and the command that runs one of its modules
with the cell's interpreter (``incell_command``).
"""

from __future__ import annotations

import atexit
import dataclasses
import errno
import hashlib
import importlib.resources
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from compatlab.cells import Cell
from compatlab.config.matrix import Matrix
from compatlab.incell.proc import InCellCommand, module_command
from compatlab.runs.model import InstallRecord, StageResult, StageState

__all__ = ["CellContext", "InCellCommand", "Stage", "blocked", "cell_env", "incell_command", "incell_path", "tethered"]

log = logging.getLogger(__name__)
_FALLBACK: list[Path] = []  # this process's private copy when the cache cannot be written


@dataclasses.dataclass(kw_only=True, slots=True)
class CellContext:
    """Everything a stage may read about its cell. Stages must not write outside ``work_dir``.

    ``site_packages``, ``freeze`` and ``install`` are filled in by the install stage (or, for an existing
    environment, by whoever made the context); ``previous`` holds the results of the stages before.
    """

    matrix: Matrix
    cell: Cell
    venv: Path
    python: Path
    work_dir: Path
    site_packages: Path | None = None
    freeze: tuple[str, ...] = ()
    install: InstallRecord | None = None
    previous: tuple[StageResult, ...] = ()
    # Where a long stage says how far it is (a line at a time, for people); None: quiet.
    say: Callable[[str], None] | None = None
    # The suites take pytest from an overlay outside the environment (suite.tools_overlay): one the lab did not
    # make (compatlab check: ``install.existing``), which is never installed into, and which has no pytest.
    tools_overlay: bool = False
    # Where what a cell keeps between runs lives (the serve stage's JIT caches): the venvs folder for a matrix
    # cell, pruned with it; None (an existing environment): $COMPATLAB_CACHE.
    caches: Path | None = None

    def stage(self, name: str) -> StageResult | None:
        for s in self.previous:
            if s.name == name:
                return s
        return None

    @property
    def site(self) -> Path:
        """The cell's site-packages; only stages that need ``install`` read it."""
        if self.site_packages is None:
            raise LookupError(f"{self.cell.id}: no site-packages yet (the install stage has not passed)")
        return self.site_packages


# A stage: name, function, and the stages that must have passed (or warned) for it to run.
@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Stage:
    name: str
    run: Callable[[CellContext], StageResult]
    needs: tuple[str, ...] = ()
    # A stage that does not run on this machine (a GPU stage on a CPU box) makes the cell partial.
    required: bool = True


def blocked(stage: Stage, ctx: CellContext) -> StageResult | None:
    """The one spelling of a stage that cannot run because a stage it needs did not pass, or None."""
    missing = []
    for name in stage.needs:
        prior = ctx.stage(name)
        if prior is None:
            missing.append(f"{name} did not run")
        elif prior.state not in (StageState.PASS, StageState.WARN):
            word = {"fail": "failed", "error": "errored", "skip": "was skipped"}.get(prior.state, prior.state)
            missing.append(f"{name} {word}")
    if not missing:
        return None
    return StageResult(name=stage.name, state=StageState.SKIP, reason="blocked: " + ", ".join(missing))


def cell_env(venv: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for processes in a cell: the venv first on PATH, no inherited library paths."""
    dropped = ("LD_LIBRARY_PATH", "LD_PRELOAD", "PYTHONPATH", "PYTHONHOME")
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    # The cell must not see stray toolkits, but a container may find the driver only this way.
    driver_dirs = [
        d for d in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if d and (Path(d) / "libcuda.so.1").exists()
    ]
    if driver_dirs:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(driver_dirs)
    env["VIRTUAL_ENV"] = str(venv)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONNOUSERSITE"] = "1"
    if extra:
        env.update(extra)
    return env


def incell_command(python: str | os.PathLike[str], module: str, *args: str) -> InCellCommand:
    """``compatlab.incell.<module>`` run by *python* (a cell's, or the checked one) on the standard library,
    its own packages and ``compatlab.incell`` only: ``incell.proc.module_command`` (which says how) in the
    folder ``incell_path()``. Run its ``argv`` with its ``cwd``."""
    return module_command(python, module, *args, root=incell_path())


def tethered(
    argv: Sequence[str], cwd: str | os.PathLike[str] | None = None, *, path: str | None = None
) -> InCellCommand:
    """*argv* run through ``compatlab.incell.tether``: started in *cwd* (default: this process's), its process
    group ended when this process dies, ``kill -9`` included. Start the result with ``start_new_session``.
    A program that is not there (on *path*, the PATH it will run with, for a bare name) raises here, as
    starting it directly would (FileNotFoundError)."""
    program = argv[0]
    if os.sep in program:
        found = program if os.access(program, os.X_OK) else None
    else:
        found = shutil.which(program, path=path)
    if found is None:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)
    return incell_command(sys.executable, "tether", str(os.getpid()), os.fspath(cwd or os.getcwd()), "--", *argv)


def incell_path(cache: Path | None = None) -> Path:
    """A folder holding ``compatlab/incell`` and nothing else of the lab: a cell's ``PYTHONPATH`` for the
    suites, the working directory of ``incell_command``.

    The cell's interpreter must see the standard library and ``compatlab.incell`` only (never the lab's
    dependencies, nor the rest of compatlab), from a checkout or an installed compatlab alike. The copy is
    named by the content hash of the package, made once, and swapped in whole with a rename. Where the cache
    cannot be written (a read-only ``$COMPATLAB_CACHE``), the copy goes to a temporary folder of this process,
    with one warning.
    """
    package = importlib.resources.files("compatlab.incell")
    files = sorted(
        (str(Path(str(f)).relative_to(str(package))), f)
        for f in _walk(package)
        if not str(f).endswith((".pyc", ".pyo"))
    )
    digest = hashlib.sha256()
    for rel, f in files:
        digest.update(rel.encode() + b"\0" + f.read_bytes() + b"\0")
    root = cache or Path(os.environ.get("COMPATLAB_CACHE") or Path.home() / ".cache" / "compatlab")
    dest = root / f"incell-{digest.hexdigest()[:16]}"
    if (dest / "compatlab" / "incell" / "__init__.py").exists():
        return dest
    try:
        root.mkdir(parents=True, exist_ok=True)
        return _copy_incell(root, dest, files)
    except OSError as exc:
        # A read-only or full cache (a shared CI machine's) costs a copy per process, never the cell.
        if not _FALLBACK:
            _FALLBACK.append(Path(tempfile.mkdtemp(prefix="compatlab-incell-")))
            atexit.register(shutil.rmtree, _FALLBACK[0], ignore_errors=True)
            log.warning(
                "cannot write the cache %s (%s): compatlab.incell is copied to %s for this process only",
                root,
                exc.strerror or exc,
                _FALLBACK[0],
            )
        private = _FALLBACK[0] / dest.name
        if (private / "compatlab" / "incell" / "__init__.py").exists():
            return private
        return _copy_incell(_FALLBACK[0], private, files)


def _copy_incell(root: Path, dest: Path, files: list[tuple[str, importlib.resources.abc.Traversable]]) -> Path:
    tmp = Path(tempfile.mkdtemp(prefix=".incell-", dir=root))
    try:
        (tmp / "compatlab").mkdir()
        (tmp / "compatlab" / "__init__.py").write_text('"""compatlab, as a cell sees it: only compatlab.incell."""\n')
        for rel, f in files:
            out = tmp / "compatlab" / "incell" / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(f.read_bytes())
        os.replace(tmp, dest)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not (dest / "compatlab" / "incell" / "__init__.py").exists():  # another run made it first: fine
            raise
    return dest


def _walk(folder: importlib.resources.abc.Traversable) -> list[importlib.resources.abc.Traversable]:
    out = []
    for item in folder.iterdir():
        if item.name == "__pycache__":
            continue
        out.extend(_walk(item) if item.is_dir() else [item])
    return out
