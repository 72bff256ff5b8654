"""The uv virtualenvs the lab makes for cells: create one, install the cell's pins with the right index per
package (``install_plan``, ``run_install``), freeze. Why uv failed is ``uv_failures``; whether a pin is on its
index, ``index.probe``; an existing environment (``compatlab check``), ``existing``.

Credentials of an index URL never reach a file or an argv: the spec and the command name each index
(``index-1`` … for per-package indexes, ``default`` for ``install.index-url``) by its URL without
them, and uv reads them from ``UV_INDEX_<NAME>_USERNAME`` / ``_PASSWORD`` (uv upper-cases the index
name and turns every other character into ``_``). Find-links have no name, so matrix.toml refuses
credentials there.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from compatlab import resolver
from compatlab.cells import Cell
from compatlab.config.matrix import Matrix
from compatlab.errors import LabError
from compatlab.index.probe import Index
from compatlab.proc import Completed, run, which
from compatlab.runs.model import InstallRecord
from compatlab.urls import has_credentials, redact, redact_text, split

__all__ = [
    "PYPI",
    "InstallPlan",
    "Pin",
    "cell_interpreter",
    "create_venv",
    "credential_variable",
    "freeze",
    "install_plan",
    "parse_freeze",
    "run_install",
    "site_packages",
    "uv_env",
    "uv_install_tools",
    "venv_python",
    "write_plan_files",
]

PYPI = "https://pypi.org/simple"


def uv_env() -> dict[str, str]:
    """Environment for uv: no interpreter downloads (they cannot succeed offline), no user config."""
    env = dict(os.environ)
    env.setdefault("UV_PYTHON_DOWNLOADS", "never")
    env.setdefault("UV_NO_CONFIG", "1")
    env.pop("VIRTUAL_ENV", None)
    env.pop("UV_SYSTEM_PYTHON", None)
    # The link mode hardlinks from the cache where the filesystem allows, so a second venv is cheap.
    env.setdefault("UV_LINK_MODE", "hardlink")
    # uv wraps its diagnostics to the terminal's width; a reason is read from one unwrapped line.
    env["COLUMNS"] = "10000"
    return env


def cell_interpreter(matrix: Matrix, cell: Cell) -> str | None:
    """The Python the cell's venv is made with: the cell's python axis value (each cell its own), else
    ``install.python``; None: the interpreter running the lab."""
    return cell.python or matrix.install.python


def create_venv(path: Path, *, python: str | None, timeout: float = 300.0) -> Completed:
    """``uv venv`` at *path* with *python* (a version uv looks for, never downloads), else the lab's own."""
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
class Pin:
    """A declared pin and the index it can only come from (None: find-links may serve it too)."""

    package: str
    version: str
    index: Index | None


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class InstallPlan:
    """One install of a cell's pins; ``files`` are written next to the venv before ``argv`` runs.

    Nothing in ``argv``, ``files`` or ``to_json`` carries a credential: those travel in ``env()`` only.
    """

    argv: list[str]
    files: dict[str, str]
    requirements: list[str]
    overrides: list[str]
    indexes: tuple[Index, ...] = ()
    pins: tuple[Pin, ...] = ()
    # A forced cell's packages that come from their own index, installed first without dependencies:
    # uv drops a package's [tool.uv.sources] index once an override names it, so the override is met by
    # what this step installed.
    pre_argv: list[str] = dataclasses.field(default_factory=list)
    # Direct-URL requirements (``pkg @ https://user:pass@host/pkg.whl``) are written without their credentials;
    # each URL's folder is an explicit index of uv's --config-file, whose credentials uv takes by prefix.
    direct: tuple[Index, ...] = ()
    forced: bool = False
    shipped: str = ""
    conflicts: tuple[str, ...] | None = None

    def record(self) -> InstallRecord:
        """What a cell's result keeps of this install (no credential is in it)."""
        return InstallRecord(
            argv=tuple(self.argv),
            files=dict(self.files),
            requirements=tuple(self.requirements),
            overrides=tuple(self.overrides),
            forced=self.forced,
            pre_argv=tuple(self.pre_argv),
            shipped=self.shipped,
            conflicts=self.conflicts,
        )

    def env(self) -> dict[str, str]:
        """uv's environment for ``argv``: ``uv_env()`` plus each index's credentials, by index name."""
        env = uv_env()
        for index in (*self.indexes, *self.direct):
            if index.credentials is None:
                continue
            env[credential_variable(index.name, "USERNAME")] = index.credentials.username
            if index.credentials.password is not None:
                env[credential_variable(index.name, "PASSWORD")] = index.credentials.password
        return env


def credential_variable(index_name: str, part: str) -> str:
    """``UV_INDEX_<NAME>_USERNAME`` / ``_PASSWORD``: uv upper-cases the name, other characters become ``_``."""
    name = "".join(ch.upper() if ch.isascii() and ch.isalnum() else "_" for ch in index_name)
    return f"UV_INDEX_{name}_{part}"


def install_plan(matrix: Matrix, cell: Cell, *, python: Path, spec_dir: Path) -> InstallPlan:
    """The uv command (argv) and the requirement file that install every pin of *cell* at once.

    Per-package indexes are uv 'explicit' indexes bound with ``[tool.uv.sources]``: a package with
    an index is taken from it and nowhere else, and no other package is taken from it. The default
    index is named too (``--default-index default=URL``): only a named index can get credentials
    from the environment, so every URL in the spec and the argv is written without them.
    """
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    requirements: list[str] = []
    direct: dict[str, Index] = {}

    def clean(text: str) -> str:
        """*text* without the credentials of its direct URL, which go to an index of uv.toml (``direct``)."""
        try:
            url = Requirement(text).url
        except InvalidRequirement:
            return text
        if not url or not has_credentials(url):
            return text
        bare, credentials = split(url)
        folder = bare.rsplit("/", 1)[0] + "/"
        if folder not in direct:
            direct[folder] = Index(
                name=f"direct-{len(direct) + 1}",
                url=folder,
                shown=redact(url).rsplit("/", 1)[0] + "/",
                credentials=credentials,
            )
        return text.replace(url, bare)

    indexes: dict[str, Index] = {}
    sources: dict[str, str] = {}
    find_links: list[str] = []
    for value in cell.packages:
        assert value.requirement is not None
        requirements.append(clean(value.requirement))
        requirements.extend(clean(r) for r in value.requires)
        if value.index:
            if value.index not in indexes:
                indexes[value.index] = Index.of(f"index-{len(indexes) + 1}", value.index)
            assert value.package is not None
            sources[value.package] = indexes[value.index].name
        for link in value.find_links:
            if has_credentials(link):  # matrix.toml's validation refuses these; never pass one to uv
                raise LabError(f"find-links URL {redact(link)} carries credentials; give such files an index")
            if link not in find_links:
                find_links.append(link)
    default = Index.of("default", matrix.install.default_index or PYPI)
    overrides = [clean(o) for o in matrix.install.overrides]
    overridden = set()
    for text in overrides:
        try:
            overridden.add(canonicalize_name(Requirement(text).name))
        except InvalidRequirement:
            continue
    # A forced cell: each axis pin is an override too, so that no other package's pin can move it.
    # install.overrides, written by hand, stay first and win.
    forced = [v for v in cell.packages if cell.force and canonicalize_name(str(v.package)) not in overridden]
    overrides += [str(v.requirement) for v in forced]
    pins = []
    for value in cell.packages:
        assert value.package is not None
        if canonicalize_name(value.package) in overridden:
            continue  # the override decides what is installed, not the pin
        index = indexes[value.index] if value.index else (None if find_links else default)
        pins.append(Pin(package=value.package, version=value.version, index=index))
    import tomli_w

    spec: dict[str, Any] = {"project": {"name": resolver.LAB_PROJECT, "version": "0", "dependencies": requirements}}
    uv_cfg: dict[str, Any] = {}
    if indexes:
        uv_cfg["index"] = [{"name": ix.name, "url": ix.url, "explicit": True} for ix in indexes.values()]
    if sources:
        uv_cfg["sources"] = {pkg: {"index": idx} for pkg, idx in sources.items()}
    if uv_cfg:
        spec["tool"] = {"uv": uv_cfg}
    files = {"pyproject.toml": tomli_w.dumps(spec)}
    uv = which("uv")
    pre_argv: list[str] = []
    own_index = [v for v in forced if v.index]
    if own_index:
        pre = {
            "project": {
                "name": "compatlab-forced",
                "version": "0",
                "dependencies": [str(v.requirement) for v in own_index],
            },
            "tool": {
                "uv": {
                    "index": uv_cfg["index"],
                    "sources": {str(v.package): {"index": sources[str(v.package)]} for v in own_index},
                }
            },
        }
        files["forced/pyproject.toml"] = tomli_w.dumps(pre)
        pre_argv = [
            uv,
            "pip",
            "install",
            "--no-deps",
            "--python",
            str(python),
            "-r",
            str(spec_dir / "forced" / "pyproject.toml"),
        ]
        if matrix.install.default_index:
            pre_argv += ["--default-index", f"{default.name}={default.url}"]
    argv = [uv, "pip", "install", "--python", str(python), "-r", str(spec_dir / "pyproject.toml")]
    if overrides:
        files["overrides.txt"] = "\n".join(overrides) + "\n"
        argv += ["--override", str(spec_dir / "overrides.txt")]
    if matrix.install.default_index:
        argv += ["--default-index", f"{default.name}={default.url}"]
    for link in find_links:
        argv += ["--find-links", link]
    if direct:
        config = {"index": [{"name": ix.name, "url": ix.url, "explicit": True} for ix in direct.values()]}
        files["uv.toml"] = tomli_w.dumps(config)
        argv += ["--config-file", str(spec_dir / "uv.toml")]
    return InstallPlan(
        argv=argv,
        files=files,
        requirements=requirements,
        overrides=overrides,
        indexes=(*indexes.values(), default),
        pins=tuple(pins),
        pre_argv=pre_argv,
        direct=tuple(direct.values()),
        forced=cell.force,
        shipped=cell.shipped,
        conflicts=cell.conflicts,
    )


def run_install(plan: InstallPlan, *, timeout: float) -> Completed:
    """Run the plan's uv command(s) with its credentials; what uv printed comes back redacted."""
    if plan.pre_argv:
        first = run(plan.pre_argv, timeout=timeout, env=plan.env())
        if not first.ok:
            return dataclasses.replace(first, stdout=redact_text(first.stdout), stderr=redact_text(first.stderr))
    done = run(plan.argv, timeout=timeout, env=plan.env())
    return dataclasses.replace(done, stdout=redact_text(done.stdout), stderr=redact_text(done.stderr))


def write_plan_files(plan: InstallPlan, spec_dir: Path) -> None:
    spec_dir.mkdir(parents=True, exist_ok=True)
    for name, text in plan.files.items():
        (spec_dir / name).parent.mkdir(parents=True, exist_ok=True)
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
