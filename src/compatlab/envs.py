"""Environments: the uv virtualenvs the lab makes for cells (create, install the cell's pins with the right
index per package, freeze), and the existing ones ``compatlab check`` is pointed at (``inspect_environment``
reads what one is and sees; ``existing_cell`` makes it a one-cell matrix).

Credentials of an index URL never reach a file or an argv: the spec and the command name each index
(``index-1`` … for per-package indexes, ``default`` for ``install.index-url``) by its URL without
them, and uv reads them from ``UV_INDEX_<NAME>_USERNAME`` / ``_PASSWORD`` (uv upper-cases the index
name and turns every other character into ``_``). Find-links have no name, so matrix.toml refuses
credentials there.

When uv finds no solution, its "not found" cannot tell a missing version from a broken index (uv reads
a 404 for the whole index as "no such project"). So each pin's index is asked directly, as uv asks it:
the project page ``<index>/<normalized-name>/`` (PEP 503 HTML, or PEP 691 JSON by content negotiation),
and, when that is 404, the index root. An index that answers without the pin is ``fail``; one that
does not answer as an index, refuses the credentials, errs (5xx) or cannot be reached is ``error``.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import logging
import os
import re
import shutil
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from compatlab import resolver
from compatlab.cells import Cell, cell_id
from compatlab.config.axes import AXIS_KINDS, CUDA_AXIS, PYTHON_AXIS, Axis, AxisValue
from compatlab.config.matrix import Matrix, Report, Target
from compatlab.errors import LabError, UsageError
from compatlab.index.client import (
    ACCEPT_PROJECT,
    ACCEPT_ROOT,
    PAGE_LIMIT,
    fetch,
    is_index_root,
    page_files,
    page_url,
    version_of,
)
from compatlab.proc import Completed, incell_command, run, which
from compatlab.runs.model import InstallRecord, StageState
from compatlab.urls import Credentials, has_credentials, redact, redact_text, split

__all__ = [
    "PYPI",
    "Environment",
    "Index",
    "InstallPlan",
    "Listing",
    "Pin",
    "canon",
    "cell_interpreter",
    "classify_uv_failure",
    "count_gpus",
    "create_venv",
    "credential_variable",
    "existing_cell",
    "explain_unsatisfiable",
    "freeze",
    "inspect_environment",
    "install_plan",
    "last_line",
    "parse_freeze",
    "probe_index",
    "run_install",
    "site_packages",
    "uv_env",
    "uv_install_tools",
    "venv_failure",
    "write_plan_files",
]

log = logging.getLogger(__name__)

PYPI = "https://pypi.org/simple"
PROBE_TIMEOUT = 15.0
_ROOT_LIMIT = 256 << 10

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
# uv's hint when an index answered 401/403: the credentials, not the stack.
_AUTH_HINT = r"lack of valid authentication credentials"
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
    # uv wraps its diagnostics to the terminal's width; a reason is read from one unwrapped line.
    env["COLUMNS"] = "10000"
    return env


def last_line(text: str) -> str:
    """The most telling line of an error output (uv puts the cause last)."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "(no output)"


def classify_uv_failure(
    done: Completed, plan: InstallPlan | None = None, *, probe_timeout: float = PROBE_TIMEOUT
) -> tuple[StageState, str]:
    """('error'|'fail', one-line reason) for a failed uv command.

    With the *plan* of a failed install, an unsatisfiable verdict is checked against the indexes
    themselves (``explain_unsatisfiable``): a pin its index lacks is ``fail`` and says what the index
    has; an index that does not answer as one is ``error``.
    """
    text = redact_text(done.stderr + "\n" + done.stdout)
    if done.timed_out:
        return StageState.ERROR, f"uv did not finish in {done.seconds:.0f} s (killed)"
    # Before the network's words: a placeholder's failed download says "not reachable" too.
    held = resolver.placeholder(text)
    if held is not None:
        return StageState.FAIL, held.describe()
    for pattern in _UNSAT_PATTERNS:
        if re.search(pattern, text, re.IGNORECASE):
            explained = explain_unsatisfiable(plan, timeout=probe_timeout) if plan is not None else None
            if explained is not None:
                return explained
            if re.search(_AUTH_HINT, text, re.IGNORECASE):
                return StageState.ERROR, "index refused access: " + _uv_summary(text, keep_hints=True)
            return StageState.FAIL, "unsatisfiable: " + _conflict(text)
    for pattern in _INFRA_PATTERNS:
        if re.search(pattern, text, re.IGNORECASE):
            return StageState.ERROR, "index or network failure: " + _which_index(text, plan) + _uv_summary(text)
    return StageState.ERROR, f"uv failed (exit {done.returncode}): " + _uv_summary(text)


def explain_unsatisfiable(plan: InstallPlan, *, timeout: float = PROBE_TIMEOUT) -> tuple[StageState, str] | None:
    """Why uv found no solution, asked of each pin's index; None when every pin is where it should be.

    A pin whose index answers without it is ``fail`` (the first such pins named, with what the index
    has); otherwise an index that is broken, refuses the credentials or cannot be reached is ``error``
    (uv's "not found" may have come from it). When every pin is on its index, the conflict is real and
    uv's own words are the better reason: None.
    """
    missing: list[str] = []
    broken: dict[str, str] = {}  # one problem per index: its first
    for pin in plan.pins:
        if pin.index is None:
            continue
        found = probe_index(pin.index, pin.package, timeout=timeout)
        if found.problem:
            broken.setdefault(pin.index.url, found.problem)
            continue
        if found.versions is None:
            missing.append(f"{pin.package} is not on {pin.index.shown}; {found.note}")
            continue
        if not any(_matches(pin.version, v) for v in found.versions):
            missing.append(
                f"{pin.package} {pin.version} is not on {pin.index.shown}; " + _has(found.versions, pin.version)
            )
    if missing:
        return StageState.FAIL, "; ".join(missing)
    if broken:
        first, *rest = broken.values()
        more = f" (and {len(rest)} more index{'es' if len(rest) > 1 else ''})" if rest else ""
        return StageState.ERROR, "index failure: " + first + more
    return None


def _conflict(text: str) -> str:
    """uv's derivation condensed to its facts (resolver.condense_conflict), else its own summary."""
    condensed = resolver.condense_conflict(text)
    if condensed is None or not condensed[1]:
        return _uv_summary(text)
    root, facts = condensed
    together = f"{root} cannot be installed together: " if " and " in root else ""
    return (together + "; ".join(facts))[:600]


def _which_index(text: str, plan: InstallPlan | None) -> str:
    """``http://host/torch/simple (the index of torch 2.9.1+cu130) did not answer: `` for the URL uv could not
    fetch, named by the plan's index it belongs to and the pins it serves; "" when uv names none."""
    m = re.search(r"Failed to fetch: `?([^`\s]+)", text) or re.search(r"for url \(([^)\s]+)\)", text)
    if m is None:
        return ""
    url = m.group(1)
    index = next((i for i in (plan.indexes if plan else ()) if url.startswith(i.url.rstrip("/") + "/")), None)
    if index is None:
        return f"{url} did not answer: "
    pins = [
        f"{p.package} {p.version}"
        for p in (plan.pins if plan else ())
        if p.index is not None and p.index.url == index.url
    ]
    served = f"the index of {', '.join(pins)}" if pins else "the install's index"
    return f"{index.shown} ({served}) did not answer: "


def _uv_summary(text: str, *, keep_hints: bool = False) -> str:
    lines = [ln.strip(" ╰─▶×|") for ln in text.splitlines()]
    lines = [ln.strip() for ln in lines if ln.strip() and (keep_hints or not ln.strip().startswith("hint:"))]
    # uv prints "error: ..." then the cause chain; keep the first error line and the innermost cause.
    first = next((ln for ln in lines if ln.startswith("error:")), lines[0] if lines else "")
    inner = lines[-1] if lines else ""
    first = first.removeprefix("error:").strip()
    if inner and inner not in first and inner.removeprefix("error:").strip() != first:
        first = f"{first} ({inner})"
    return first.replace(f"{resolver.LAB_PROJECT} ", "the cell ")[:600]


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


def venv_failure(done: Completed, *, python: str | None, cell: Cell) -> str:
    """Why ``uv venv`` failed, in one line; an interpreter uv cannot find is named with where it was asked."""
    text = redact_text(done.stderr + "\n" + done.stdout)
    if python is not None and re.search(r"No interpreter found", text, re.IGNORECASE):
        asked = f"the cell's {PYTHON_AXIS} axis" if cell.python else "install.python"
        drop = f"remove {python} from axes.{PYTHON_AXIS}" if cell.python else "change install.python"
        return (
            f"no Python {python} interpreter on this machine ({asked}; uv looks on PATH and in its own "
            f"installs, and downloads none here): install Python {python} where uv finds it, or {drop}"
        )
    if python is not None and (shim := re.search(r"Failed to inspect Python interpreter .*? at `([^`]+)`", text)):
        return _uninspectable(python, shim.group(1), text)
    _, why = classify_uv_failure(done)
    return "uv venv failed: " + why


def _uninspectable(python: str, found: str, text: str) -> str:
    """uv found an interpreter for *python* at *found* and could not run it: a pyenv shim for a version pyenv
    has but has not activated says which version and the fix; anything else says what running it said."""
    versions = re.search(r"command exists in these Python versions:[ \t]*\n((?:[ \t]+[\w.+-]+[ \t]*\n?)+)", text)
    if "pyenv:" in text and versions:
        have = versions.group(1).split()
        root = Path(found).parent.parent  # ~/.pyenv/shims/python3.12 -> ~/.pyenv
        where = root / "versions" / have[-1] / "bin" / f"python{python}"
        return (
            f"Python {python}: uv found {found}, a pyenv shim, and pyenv has {', '.join(have)} but has not "
            f"activated it ({where}); fix: `pyenv global <your default> {have[-1]}` so that the shim answers, "
            "or put that interpreter's folder first on PATH"
        )
    cause = re.search(r"cause: (.+)", text)
    err = re.search(r"\[stderr\]\s*\n\s*(\S.*)", text)
    said = "; ".join(x.group(1).strip() for x in (cause, err) if x) or "no output"
    return f"Python {python}: uv found {found} and could not run it: {said}"


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def site_packages(venv: Path) -> Path:
    found = sorted((venv / "lib").glob("python3*/site-packages"))
    if not found:
        raise FileNotFoundError(f"no site-packages under {venv}")
    return found[0]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Index:
    """An index of the install: its name in the spec, its URL without credentials, and those apart.

    ``shown`` is the URL as a person may see it (``urls.redact``): ``https://***@host/simple``.
    """

    name: str
    url: str
    shown: str
    credentials: Credentials | None = dataclasses.field(default=None, repr=False)

    @classmethod
    def of(cls, name: str, url: str) -> Index:
        """The index *name* for *url* as matrix.toml gives it, credentials and all."""
        clean, credentials = split(url)
        return cls(name=name, url=clean, shown=redact(url), credentials=credentials)


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


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Listing:
    """What an index says of one project: its versions, or why it has none, or why it did not answer.

    ``problem`` set: the index is broken, refuses us or is unreachable (an ``error``). Otherwise the index
    answers: ``versions`` lists the project's versions, or is None with ``note`` saying why there are none.
    """

    versions: tuple[str, ...] | None = None
    note: str = ""
    problem: str = ""


def _refusal(index: Index, status: int, what: str) -> str:
    if status in (401, 403) and index.credentials is None:
        return (
            f"{index.shown} needs credentials (HTTP {status} for {what}); put them in the URL as "
            "https://user:password@host/…"
        )
    if status in (401, 403):
        return f"{index.shown} refused the credentials (HTTP {status} for {what}); check the user name and password"
    return f"{index.shown} answered HTTP {status} for {what}"


def probe_index(index: Index, package: str, *, timeout: float = PROBE_TIMEOUT) -> Listing:
    """Ask *index* for *package*'s PEP 503/691 page, as uv does, and tell what it lists.

    A 404 (or an HTML page without distribution links) on the project page is read against the root:
    a root that answers as a simple index means the index works and lacks the project; a root that is
    404 too, or an HTML page that is not an index (a web site's catch-all route), means the URL is not
    an index at all. Only the first 256 KiB of the root are read (PyPI's lists every project).
    """
    from packaging.utils import canonicalize_name

    name = canonicalize_name(package)
    what = f"{name}'s page"
    page = fetch(page_url(index.url, name), index.credentials, accept=ACCEPT_PROJECT, limit=PAGE_LIMIT, timeout=timeout)
    if page.status is None:
        return Listing(problem=f"{index.shown} is unreachable: {page.unreachable}")
    if page.status == 200 and (page.json is not None or page_files(page)):
        versions = sorted({v for f in page_files(page) if (v := version_of(f, name)) is not None}, key=Version)
        if versions:
            return Listing(versions=tuple(versions))
        return Listing(note="the index lists no files for it")
    if page.status not in (200, 404, 410):
        return Listing(problem=_refusal(index, page.status, what))
    root = fetch(page_url(index.url), index.credentials, accept=ACCEPT_ROOT, limit=_ROOT_LIMIT, timeout=timeout)
    if root.status is None:
        return Listing(problem=f"{index.shown} is unreachable: {root.unreachable}")
    if is_index_root(root):
        if page.status == 200:
            return Listing(note="the index lists no files for it")
        return Listing(note="the index has no such project")
    if root.status not in (200, 404, 410):
        return Listing(problem=_refusal(index, root.status, "its root"))
    if root.status == 200:
        return Listing(
            problem=f"{index.shown} does not answer as a package index: its root is an HTML page "
            "that is not a simple index (PEP 503); check the URL"
        )
    return Listing(
        problem=f"{index.shown} does not answer as a package index: HTTP {root.status} for its "
        f"root and {page.status} for {what}; check the URL"
    )


def _matches(pinned: str, available: str) -> bool:
    """``==pinned`` as uv reads it: ``==2.9.1`` takes ``2.9.1+cu130``, ``==2.9.1+cu130`` only that."""
    return SpecifierSet(f"=={pinned}").contains(available, prereleases=True)


def _has(versions: Sequence[str], pinned: str, shown: int = 10) -> str:
    """``it has 2.9.0, 2.9.1, 2.10.0``: the versions nearest the pin when there are many."""
    at = bisect.bisect([Version(v) for v in versions], Version(pinned))
    lo = max(0, min(at - shown // 2, len(versions) - shown))
    near = versions[lo : lo + shown]
    more = len(versions) - len(near)
    return "it has " + ", ".join(near) + (f" (and {more} more)" if more else "")


# An existing environment (compatlab check).


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
        want = canon(name)
        return next((v for d, v in self.dists.items() if canon(d) == want), None)

    def site_for(self, names: Sequence[str]) -> Path:
        """The site directory holding most of *names* (the static stage reads one site directory)."""
        counts: dict[str, int] = {}
        for name in names:
            site = self.sites.get(self.spelled(name) or name, "")
            if site:
                counts[site] = counts.get(site, 0) + 1
        return Path(max(counts, key=lambda s: counts[s])) if counts else self.site

    def spelled(self, name: str) -> str | None:
        want = canon(name)
        return next((d for d in self.dists if canon(d) == want), None)


def canon(name: str) -> str:
    """A distribution name as PEP 503 compares it."""
    return re.sub(r"[-_.]+", "-", name).lower()


def inspect_environment(python: Path) -> Environment:
    """Run *python* once and read what it is and sees. UsageError when it is not a usable interpreter."""
    python = Path(os.path.abspath(python))  # the probe runs in another folder: a relative path would miss
    if not python.exists():
        raise UsageError(f"{python}: no such interpreter; pass --python PATH or --venv DIR of the environment")
    # compatlab.incell.inspect_env, with the checked interpreter: who it is, and every distribution it sees.
    command = incell_command(python, "inspect_env")
    try:
        done = run(command.argv, timeout=120, env=_plain_env(), cwd=command.cwd)
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


def count_gpus() -> int:
    """NVIDIA GPUs this machine has, from the driver's /proc entries (else nvidia-smi -L); 0 without a driver."""
    proc = Path("/proc/driver/nvidia/gpus")
    if proc.is_dir():
        return sum(1 for _ in proc.iterdir())
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
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
        pinned = next((v for n, v in pins.items() if canon(n) == canon(kind.package)), None)
        if spelled is None and pinned is None:
            continue
        version = pinned or env.dists[spelled or kind.package]
        values.append(AxisValue(axis=axis, version=version, package=spelled or kind.package))
    return values


def existing_cell(
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

    The cell's packages are *packages* (every distribution when empty, pure Python included), the pinned
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
                + "; `compatlab check` without --package checks every distribution"
            )
        chosen = [env.spelled(p) or p for p in packages]
    else:
        chosen = sorted(env.dists, key=str.lower)  # pure Python too: its import can fail as well
    stack = _stack_values(env, pins)
    from compatlab.site import cuda_of_torch

    cuda = cuda_of_torch(env.torch_version_py, env.version_of("torch"))
    axis_values = list(stack)
    if cuda:
        axis_values.append(AxisValue(axis=CUDA_AXIS, version=cuda))
    if not axis_values:
        axis_values.append(AxisValue(axis=PYTHON_AXIS, version=env.version))
    in_stack = {canon(v.package) for v in stack if v.package}
    extra: list[AxisValue] = []
    for name in [*chosen, *pins]:
        if canon(name) in in_stack or any(canon(name) == canon(v.axis) for v in extra):
            continue
        pinned = next((v for n, v in pins.items() if canon(n) == canon(name)), None)
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
