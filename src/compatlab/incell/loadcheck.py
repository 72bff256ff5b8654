"""Load extension modules one per process and say, in one line, why one would not load.

The per-process path: each module (or package) is loaded by the probe (``compatlab.incell.probe``) in a fresh
interpreter of its own, with a timeout and in its own process group, and the finished process is classified
(``loading.failure.classify``). A load that failed without naming why is run once more with the loader's own
log on (``LD_DEBUG=files``), which names the libraries C code asked ``dlopen`` for and never got. The fork
server (``forkserver``) gives the same verdicts from children of one interpreter.

Standard library and compatlab.incell only, because it runs inside a cell's venv, where only the cell's packages,
pytest and compatlab's pure-Python modules are importable. What a load is made of (what to load, the ELF
reading, what a load tried, why it failed) is in ``loading/``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from compatlab.incell.loading.failure import LoadFailure, classify
from compatlab.incell.loading.observed import c_level_failures
from compatlab.incell.proc import HERE, Completed, InCellCommand, bytecode_prefix, module_command, run

__all__ = ["c_level_probe", "load_module", "probe_command"]


def c_level_probe(
    python: str,
    *,
    path: str | None,
    name: str,
    pre_import: Sequence[str] = (),
    timeout: float = 120.0,
    env: Mapping[str, str],
    debug_dir: Path,
) -> list[tuple[str, str]]:
    """Load module *path* as *name* (or import package *name*) once more in a fresh interpreter with the
    loader's own log on (``LD_DEBUG=files``): the libraries C code of the stack tried to load and could not,
    which no Python door sees (``c_level_failures``). The fallback for a load that failed without naming why."""
    debug_dir.mkdir(parents=True, exist_ok=True)
    watched = {**env, "LD_DEBUG": "files", "LD_DEBUG_OUTPUT": str(debug_dir / "ld")}
    load_module(python, path=path, name=name, pre_import=pre_import, timeout=timeout, env=watched)
    return c_level_failures(debug_dir, python)


def probe_command(python: str, *, path: str | None, name: str, pre_import: Sequence[str] = ()) -> InCellCommand:
    """The probe (``compatlab.incell.probe``) that loads *path* as module *name* (or imports package *name*
    when path is None) with *python*, after importing *pre_import*."""
    return module_command(
        python, "probe", path or "", name, ",".join(pre_import), root=HERE, bytecode=bytecode_prefix()
    )


def load_module(
    python: str,
    *,
    path: str | None,
    name: str,
    pre_import: Sequence[str] = (),
    timeout: float = 120.0,
    env: Mapping[str, str] | None = None,
) -> tuple[LoadFailure | None, Completed]:
    """Load one module in a fresh interpreter with a timeout, in its own process group; classify it."""
    command = probe_command(python, path=path, name=name, pre_import=pre_import)
    done = run(command.argv, timeout=timeout, env=env if env is not None else dict(os.environ), cwd=command.cwd)
    return classify(done), done
