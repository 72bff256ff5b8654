"""Where the Python processes a cell runs keep their bytecode: outside the environment, compiled once.

A venv uv makes holds no bytecode (uv compiles none unless asked), and a box that sets
``PYTHONDONTWRITEBYTECODE`` (many container images do), like the lab's own ``-B``, writes none: every process
then compiles every module it imports from its source. That was most of an import: ``import torch,
transformers, scipy.stats`` and SGLang's scheduler took 36 s from source and 14-16 s from bytecode on the
2-core machine, and each SGLang server starts four such processes, each child of the import stage another.

Python keeps bytecode in a folder of its own when told to (``PYTHONPYCACHEPREFIX``, ``-X pycache_prefix``): a
tree that mirrors the sources' absolute paths, each file checked against its source's mtime and size as a
``__pycache__`` file is, and written atomically (a process never reads another's half-written file).

- A matrix cell: a folder inside its venv, made and removed with it (each run makes its venvs afresh), shared
  by the cell's import, cuda and serve stages and by ``nox -s gpu8_perf`` on that run's venvs. What the cell's
  processes import that is not of the venv, the interpreter's standard library and the lab's own in-cell code
  (``proc.incell_path()``, a copy named by its content hash), is the same in every cell: its part of the tree
  is a link to one folder beside the venvs (``<venvs>/.bytecode-shared``, pruned with them), compiled by the
  first cell and read by the others (before, each fresh venv compiled about 170 modules of them again: about
  0.4 s of the 0.7 s a stub cell's suites spent compiling, on the 2-core machine).
- An existing environment (``compatlab check``): ``$COMPATLAB_CACHE/bytecode/<key>``, the key the stack (every
  distribution and version) and the environment's path, so it is kept between checks and never serves another
  stack (a version whose file has the same size and mtime as the one before would otherwise be taken for it).
  The environment itself is never written.
- An environment that has its bytecode beside its sources (pip compiles it at install) is read as it is: its
  processes write none (a folder of our own would be compiled afresh, since Python then reads only that one).
  That takes every site-packages of it that holds a package: a venv over a system's packages
  (``--system-site-packages``) whose own folder has none (the SGLang stack uv put there) gets the folder,
  compiled once; an empty site-packages tells nothing.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

from compatlab.proc import default_cache_dir
from compatlab.site import python_version_of
from compatlab.stages.base import CellContext, stack_of

__all__ = ["IN_VENV", "SHARED", "bytecode_env", "bytecode_folder", "has_own_bytecode"]

log = logging.getLogger(__name__)

IN_VENV = ".compatlab-bytecode"  # a matrix cell's bytecode, inside its venv
SHARED = ".bytecode-shared"  # beside the venvs: the bytecode of what every cell imports from outside its venv
_SAMPLE = 24  # top-level packages looked at for bytecode of their own


def has_own_bytecode(site_packages: Path) -> bool | None:
    """Whether most of the packages of *site_packages* (a sample of them) hold their ``__init__``'s bytecode
    for this environment's Python beside it (``__pycache__/__init__.cpython-312.pyc``); None for a folder
    with no package to tell by (empty, or not there)."""
    version = python_version_of(site_packages)
    try:
        packages = sorted(p for p in site_packages.iterdir() if (p / "__init__.py").is_file())[:_SAMPLE]
    except OSError:
        return None
    if not packages:
        return None
    if version is None:
        return False
    tag = f"cpython-{version[0]}{version[1]}"
    compiled = sum(1 for p in packages if (p / "__pycache__" / f"__init__.{tag}.pyc").is_file())
    return compiled * 2 >= len(packages)


def bytecode_folder(ctx: CellContext) -> Path | None:
    """The cell's bytecode folder (the module says where), or None where its environment has its own."""
    if ctx.caches is not None:
        return ctx.venv / IN_VENV
    sites = {
        *([ctx.site_packages] if ctx.site_packages is not None else []),
        *ctx.venv.glob("lib/python3*/site-packages"),
    }
    told = [own for own in map(has_own_bytecode, sites) if own is not None]  # an empty folder tells nothing
    if told and all(told):
        return None
    key = hashlib.sha256(f"{stack_of(ctx)}\n{os.path.abspath(ctx.venv)}".encode()).hexdigest()[:16]
    base = default_cache_dir()
    return base / "bytecode" / key


def bytecode_env(ctx: CellContext, env: dict[str, str]) -> dict[str, str]:
    """*env* for a Python process of the cell: ``PYTHONPYCACHEPREFIX`` at the cell's bytecode folder (an
    inherited ``PYTHONDONTWRITEBYTECODE`` dropped: what it protects, the environment, is not written); where
    the environment has its own bytecode, or the folder cannot be made, ``PYTHONDONTWRITEBYTECODE=1`` and no
    prefix (its own bytecode is then what Python reads)."""
    out = {k: v for k, v in env.items() if k not in ("PYTHONPYCACHEPREFIX", "PYTHONDONTWRITEBYTECODE")}
    folder = bytecode_folder(ctx)
    if folder is not None:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError:
            folder = None  # an unwritable cache costs the compiling again, never the verdict
    if folder is None:
        out["PYTHONDONTWRITEBYTECODE"] = "1"
    else:
        out["PYTHONPYCACHEPREFIX"] = str(folder)
        if ctx.caches is not None:
            _share(folder, ctx.caches / SHARED, _outside_the_venv(ctx))
    return out


def _outside_the_venv(ctx: CellContext) -> list[Path]:
    """The source folders every cell's processes import from that no environment changes: the standard
    library of the venv's interpreter (``home`` in its pyvenv.cfg, ``lib/pythonX.Y`` beside it; uv writes the
    version as ``version_info``, ``python -m venv`` as ``version``) and the lab's in-cell code where it is
    kept in the cache (a copy in a temporary folder is this process's alone)."""
    from compatlab.proc import incell_path

    roots: list[Path] = []
    cfg: dict[str, str] = {}
    try:
        for line in (ctx.venv / "pyvenv.cfg").read_text(encoding="utf-8").splitlines():
            key, _, value = line.partition("=")
            cfg[key.strip()] = value.strip()
    except OSError:
        pass
    home, version = cfg.get("home", ""), (cfg.get("version_info") or cfg.get("version", "")).split(".")
    if home and len(version) >= 2:
        stdlib = Path(home).parent / "lib" / f"python{version[0]}.{version[1]}"
        if (stdlib / "os.py").is_file():
            roots.append(stdlib)
    incell = incell_path()
    if incell.parent == default_cache_dir():
        roots.append(incell)
    return roots


def _share(folder: Path, shared: Path, roots: list[Path]) -> None:
    """Make each of *roots*' part of the bytecode tree *folder* a link to the same part of *shared*. Python
    writes each file of it atomically (a temporary file, then a rename), so cells side by side never read a
    half-written one, and checks each against its source's mtime and size as ever. Where a link cannot be
    made, that part is compiled in the cell's own folder, as before: it costs time, never a verdict."""
    for root in roots:
        rel = root.relative_to(root.anchor)  # the tree mirrors each source's absolute path as Python sees it
        link, target = folder / rel, shared / rel
        if link.is_symlink() or link.exists():
            continue
        try:
            target.mkdir(parents=True, exist_ok=True)
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(target, target_is_directory=True)
        except OSError as exc:
            log.debug("bytecode of %s stays the cell's own: %s", root, exc)
