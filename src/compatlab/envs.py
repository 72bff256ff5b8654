"""uv virtualenvs for cells: create, install the cell's pins with the right index per package, freeze."""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from compatlab.cells import Cell
from compatlab.config.matrix import Matrix
from compatlab.proc import Completed, run, which

__all__ = [
    "InstallPlan",
    "classify_uv_failure",
    "create_venv",
    "freeze",
    "install_plan",
    "last_line",
    "parse_freeze",
    "site_packages",
    "uv_env",
    "uv_install_tools",
]

log = logging.getLogger(__name__)

# uv's words for a network or index failure: the infrastructure, not the stack.
_INFRA_PATTERNS = (
    r"Failed to fetch",
    r"error sending request",
    r"Connection refused",
    r"connection (?:reset|closed)",
    r"dns error",
    r"failed to lookup address",
    r"tcp connect error",
    r"operation timed out",
    r"timed out",
    r"Could not connect",
    r"HTTP status server error",
    r"Network is unreachable",
    r"Failed to download",
    r"failed to read from file",
    r"No space left on device",
)
_UNSAT_PATTERNS = (
    r"No solution found when resolving dependencies",
    r"Because .* we can conclude",
    r"no version of",
    r"not found in the package registry",
    r"there is no version of",
    r"only .* is available",
)


def uv_env() -> dict[str, str]:
    """Environment for uv: no interpreter downloads (they cannot succeed offline), no user config."""
    env = dict(os.environ)
    env.setdefault("UV_PYTHON_DOWNLOADS", "never")
    env.setdefault("UV_NO_CONFIG", "1")
    env.pop("VIRTUAL_ENV", None)
    env.pop("UV_SYSTEM_PYTHON", None)
    # The link mode hardlinks from the cache where the filesystem allows, so a second venv is cheap.
    env.setdefault("UV_LINK_MODE", "hardlink")
    return env


def last_line(text: str) -> str:
    """The most telling line of an error output (uv puts the cause last)."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "(no output)"


def classify_uv_failure(done: Completed) -> tuple[str, str]:
    """('error'|'fail', one-line reason) for a failed uv command."""
    text = done.stderr + "\n" + done.stdout
    if done.timed_out:
        return "error", f"uv did not finish in {done.seconds:.0f} s (killed)"
    for pattern in _UNSAT_PATTERNS:
        if re.search(pattern, text, re.IGNORECASE):
            return "fail", "unsatisfiable: " + _uv_summary(text)
    for pattern in _INFRA_PATTERNS:
        if re.search(pattern, text, re.IGNORECASE):
            return "error", "index or network failure: " + _uv_summary(text)
    return "error", f"uv failed (exit {done.returncode}): " + _uv_summary(text)


def _uv_summary(text: str) -> str:
    lines = [ln.strip(" ╰─▶×|") for ln in text.splitlines()]
    lines = [ln.strip() for ln in lines if ln.strip() and not ln.strip().startswith("hint:")]
    # uv prints "error: ..." then the cause chain; keep the first error line and the innermost cause.
    first = next((ln for ln in lines if ln.startswith("error:")), lines[0] if lines else "")
    inner = lines[-1] if lines else ""
    first = first.removeprefix("error:").strip()
    if inner and inner not in first and inner.removeprefix("error:").strip() != first:
        return f"{first} ({inner})"[:600]
    return first[:600]


def create_venv(path: Path, *, python: str | None, timeout: float = 300.0) -> Completed:
    uv = which("uv")
    argv = [uv, "venv", "--clear", "--no-project", "--quiet", str(path)]
    argv += ["--python", python or sys.executable]
    return run(argv, timeout=timeout, env=uv_env())


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def site_packages(venv: Path) -> Path:
    found = sorted((venv / "lib").glob("python3*/site-packages"))
    if not found:
        raise FileNotFoundError(f"no site-packages under {venv}")
    return found[0]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class InstallPlan:
    """One install of a cell's pins; ``files`` are written next to the venv before ``argv`` runs."""

    argv: list[str]
    files: dict[str, str]
    requirements: list[str]
    overrides: list[str]

    def to_json(self) -> dict[str, object]:
        return {"argv": self.argv, "files": self.files, "requirements": self.requirements,
                "overrides": self.overrides}


def install_plan(matrix: Matrix, cell: Cell, *, python: Path, spec_dir: Path) -> InstallPlan:
    """The uv command (argv) and the requirement file that install every pin of *cell* at once.

    Per-package indexes are uv 'explicit' indexes bound with ``[tool.uv.sources]``: a package with
    an index is taken from it and nowhere else, and no other package is taken from it.
    """
    requirements: list[str] = []
    indexes: dict[str, str] = {}
    sources: dict[str, str] = {}
    find_links: list[str] = []
    for value in cell.packages:
        assert value.requirement is not None
        requirements.append(value.requirement)
        requirements.extend(value.requires)
        if value.index:
            name = indexes.setdefault(value.index, f"index-{len(indexes) + 1}")
            assert value.package is not None
            sources[value.package] = name
        for link in value.find_links:
            if link not in find_links:
                find_links.append(link)
    import tomli_w

    spec: dict[str, Any] = {"project": {"name": "compatlab-cell", "version": "0", "dependencies": requirements}}
    uv_cfg: dict[str, Any] = {}
    if indexes:
        uv_cfg["index"] = [{"name": name, "url": url, "explicit": True} for url, name in indexes.items()]
    if sources:
        uv_cfg["sources"] = {pkg: {"index": idx} for pkg, idx in sources.items()}
    if uv_cfg:
        spec["tool"] = {"uv": uv_cfg}
    files = {"pyproject.toml": tomli_w.dumps(spec)}
    uv = which("uv")
    argv = [uv, "pip", "install", "--python", str(python), "-r", str(spec_dir / "pyproject.toml")]
    overrides = list(matrix.install.overrides)
    if overrides:
        files["overrides.txt"] = "\n".join(overrides) + "\n"
        argv += ["--override", str(spec_dir / "overrides.txt")]
    if matrix.install.default_index:
        argv += ["--index-url", matrix.install.default_index]
    for link in find_links:
        argv += ["--find-links", link]
    return InstallPlan(argv=argv, files=files, requirements=requirements, overrides=overrides)


def write_plan_files(plan: InstallPlan, spec_dir: Path) -> None:
    spec_dir.mkdir(parents=True, exist_ok=True)
    for name, text in plan.files.items():
        (spec_dir / name).write_text(text, encoding="utf-8")


def freeze(python: Path, timeout: float = 120.0) -> Completed:
    return run([which("uv"), "pip", "freeze", "--python", str(python)], timeout=timeout, env=uv_env())


def parse_freeze(lines: Iterable[str]) -> dict[str, str]:
    """``name==version`` lines to {canonical name: version}."""
    from packaging.utils import canonicalize_name

    out: dict[str, str] = {}
    for raw in lines:
        line = raw.strip()
        if "==" in line and not line.startswith("#"):
            name, _, version = line.partition("==")
            out[canonicalize_name(name)] = version.strip()
        elif " @ " in line:
            name, _, url = line.partition(" @ ")
            out[canonicalize_name(name)] = "@ " + url.strip()
    return out


def uv_install_tools(python: Path, requirements: Sequence[str], *, timeout: float) -> Completed:
    """Install test tooling (pytest) into a cell without touching what is already there."""
    argv = [which("uv"), "pip", "install", "--python", str(python), *requirements]
    return run(argv, timeout=timeout, env=uv_env())
