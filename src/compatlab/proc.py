"""Subprocesses for the lab: ``run`` (from ``incell.proc``, which the cell shares), ``which``, signals, and
the command that runs a module of ``compatlab.incell`` with a cell's interpreter (``incell_command``, in the
folder ``incell_path()`` that holds ``compatlab.incell`` alone; ``tethered`` for one tied to this process).

A cell runs in a process that nox started. SIGTERM and SIGHUP are handled like SIGINT (KeyboardInterrupt):
``run`` kills the running command's whole process group and waits for it on the way out, finished cells
are kept, and nothing is written afterwards. If nox itself dies (``kill -9``), the kernel sends the cell
process SIGTERM (Linux's parent-death signal), so an orphan never goes on to write over a newer run.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import errno
import hashlib
import importlib.resources
import logging
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import FrameType

from compatlab.errors import LabError
from compatlab.incell.proc import Completed, InCellCommand, held_while_starting, module_command, run

__all__ = [
    "Completed",
    "InCellCommand",
    "ProgramNotFound",
    "Terminated",
    "default_cache_dir",
    "incell_command",
    "incell_path",
    "run",
    "signals_interrupt",
    "tethered",
    "which",
]

log = logging.getLogger(__name__)
_FALLBACK: list[Path] = []  # this process's private copy when the cache cannot be written


class ProgramNotFound(LabError):
    """A program the lab needs is not on PATH."""


def which(program: str) -> str:
    """Absolute path of *program*, or a clear error."""
    found = shutil.which(program)
    if found is None:
        raise ProgramNotFound(
            f"program {program!r} not found on PATH; install it (e.g. python -m pip install {program})"
        )
    return found


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP arrived: unwinds like Ctrl-C, so every ``run`` kills its process group on the way."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


_PR_SET_PDEATHSIG = 1


# Set by the first stop signal: the ones after it are not raised again while the first unwinds. Two come
# together often (SIGHUP to nox's group ends nox at once, and its death sends the cell SIGTERM): raised at the
# first line of ``run``'s clean-up, the second unwound past its kill of the command's group, and a hung
# ``uv pip install`` ran on with no parent.
_STOPPING: list[int] = []


def _raise(signum: int, frame: FrameType | None) -> None:
    if not _STOPPING and not held_while_starting(signum):
        _STOPPING.append(signum)
        raise Terminated(signum)


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    if not _STOPPING and not held_while_starting(signum):
        _STOPPING.append(signum)
        raise KeyboardInterrupt


@contextlib.contextmanager
def signals_interrupt(*, parent_death: bool = True) -> Iterator[None]:
    """Within the block, SIGINT raises KeyboardInterrupt, and SIGTERM and SIGHUP ``Terminated`` (one).

    With *parent_death* (Linux), the process also gets SIGTERM when its parent dies, ``kill -9`` included.
    """
    # SIGINT too: a process started in the background by a shell inherits SIGINT ignored, and Python then
    # never turns it into KeyboardInterrupt; a cell must stop on it all the same.
    old = {
        s: signal.signal(s, _raise_interrupt if s == signal.SIGINT else _raise)
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    }
    if parent_death and sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            parent = os.getppid()
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
            if os.getppid() != parent:  # the parent died before the call: it will not be signalled
                raise Terminated(signal.SIGTERM)
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        _STOPPING.clear()


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


def default_cache_dir() -> Path:
    """The lab's cache: ``$COMPATLAB_CACHE``, else ``~/.cache/compatlab``."""
    env = os.environ.get("COMPATLAB_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "compatlab"


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
    root = cache or default_cache_dir()
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
