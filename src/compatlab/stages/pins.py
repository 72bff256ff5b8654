"""The pins stage: is every declared package installed as declared, does every file have one owner, and is
there one CUDA major?

A file two distributions install with different bytes is told by ``owners.file_clashes``: on code, a
failure (what ``import`` runs depends on install order); on data files only, a warning.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from compatlab.incell.cudacompat import FAMILY_MIN_DRIVER
from compatlab.runs.model import StageResult, StageState
from compatlab.runs.records.pins import BrokenRequirement, FileClash, Pin, PinsDetails
from compatlab.site import SiteDist, dists_by_name, python_version_of, torch_cuda
from compatlab.stages import owners
from compatlab.stages.base import CellContext

__all__ = ["broken_requirements", "cuda_major_of", "run_pins_stage"]

# Oldest driver that runs each CUDA major (CUDA's release notes, "minimum required driver").
MIN_DRIVER = FAMILY_MIN_DRIVER


def _active(req: Requirement, extras: Iterable[str] = ()) -> bool:
    if req.marker is None:
        return True
    try:
        return any(req.marker.evaluate({"extra": e}) for e in ("", *extras))
    except Exception:  # noqa: BLE001 - an odd marker must not crash the stage
        return True


def _requirements_on(dists: dict[str, SiteDist], target: str) -> list[tuple[SiteDist, Requirement]]:
    out = []
    for dist in dists.values():
        for raw in dist.requires:
            try:
                req = Requirement(raw)
            except InvalidRequirement:
                continue
            if canonicalize_name(req.name) == target and _active(req):
                out.append((dist, req))
    return out


def _applies(req: Requirement, env: dict[str, str]) -> bool:
    if req.marker is None:
        return True
    try:
        return req.marker.evaluate({**env, "extra": ""})
    except Exception:  # noqa: BLE001 - a marker that cannot be evaluated is not a verdict
        return False


def broken_requirements(
    dists: dict[str, SiteDist], python: tuple[int, int] | None = None, elsewhere: dict[str, str] | None = None
) -> list[dict[str, str]]:
    """Every Requires-Dist of an installed distribution that the installed set violates, as ``uv pip check``
    reads them: requirements without an extra, markers evaluated for the cell's Python; a requirement on a
    distribution that is not installed, or installed at a version outside the specifier (pre-releases
    allowed). Each as {"by", "requires", "package", "installed", "text"}, "installed" "" when absent.
    *elsewhere* holds the versions of what the environment has in other site directories (canonical name ->
    version: a GPU box's system packages under a venv), which meet a requirement too."""
    env = {"python_version": f"{python[0]}.{python[1]}"} if python else {}
    out = []
    for dist in sorted(dists.values(), key=lambda d: d.canonical):
        for raw in dist.requires:
            try:
                req = Requirement(raw)
            except InvalidRequirement:
                continue
            if not _applies(req, env):
                continue
            target = canonicalize_name(req.name)
            got = dists[target].version if target in dists else (elsewhere or {}).get(target)
            spec = f"{req.name}{req.specifier}"
            if got is None:
                text = f"{dist.name} {dist.version} requires {spec}, which is not installed"
            elif req.specifier and not req.specifier.contains(got, prereleases=True):
                text = f"{dist.name} {dist.version} requires {spec}; {req.name} {got} is installed"
            else:
                continue
            out.append(
                {"by": dist.canonical, "requires": spec, "package": target, "installed": got or "", "text": text}
            )
    return out


def _same_pin(declared: str, installed: str) -> bool:
    try:
        d, i = Version(declared), Version(installed)
    except InvalidVersion:
        return declared == installed
    if d.local is not None:
        return d == i and d.local == i.local
    return d.public == i.public


# Packages whose version number is the CUDA version they belong to (cuFFT, cuRAND, cuSOLVER, cuSPARSE,
# cuDNN, NCCL … number themselves: cuFFT 12.0 ships with CUDA 13.0).
_TRACKS_CUDA = frozenset(
    {
        "cuda-bindings",
        "cuda-python",
        "cuda-toolkit",
        "nvidia-cuda-runtime",
        "nvidia-cuda-nvrtc",
        "nvidia-cuda-cupti",
        "nvidia-cuda-nvcc",
        "nvidia-cublas",
        "nvidia-nvjitlink",
        "nvidia-nvtx",
    }
)


def cuda_major_of(name: str, version: str, files: Iterable[str] = ()) -> int | None:
    """The CUDA major a CUDA runtime package belongs to, or None for unrelated packages.

    Told by, in order: a ``-cu12``/``-cu13`` (``-cuda12x``) suffix, files under ``nvidia/cu13/`` (the
    CUDA 13 wheel layout), and the version, for packages whose version is CUDA's own.
    """
    m = re.search(r"-cu(\d{2})$", name) or re.search(r"-cuda(\d{2})x?$", name)
    if m:
        return int(m.group(1))
    if name.startswith("nvidia-"):
        for path in files:
            if m := re.match(r"nvidia/cu(\d{2})/", path):
                return int(m.group(1))
    if name in _TRACKS_CUDA:
        try:
            major = Version(version).release[0]
        except InvalidVersion:
            return None
        return major if major in (11, 12, 13, 14) else None
    return None


def _record_paths(dist: SiteDist) -> list[str]:
    return dist.files if dist.canonical.startswith("nvidia-") else []


def _family(name: str) -> str:
    return re.sub(r"-cu\d{2}$", "", name)


def _who_asked(dists: dict[str, SiteDist], name: str) -> list[str]:
    return [f"{d.name} {d.version} requires {str(r)!r}" for d, r in _requirements_on(dists, name)]


def _driver_ok(min_driver: str | None, needed: str) -> bool | None:
    """Compare at the precision the matrix gives: min-driver '580.65' covers 580.65.06."""
    if not min_driver:
        return None
    try:
        have, need = Version(min_driver).release, Version(needed).release
    except InvalidVersion:
        return None
    return have >= need[: len(have)]


def run_pins_stage(ctx: CellContext) -> StageResult:
    dists = dists_by_name(ctx.site)
    fails: list[str] = []
    warns: list[str] = []
    pins: list[Pin] = []
    overrides = [Requirement(o) for o in ctx.matrix.install.overrides]
    for value in ctx.cell.packages:
        assert value.package is not None
        cname = canonicalize_name(value.package)
        got = dists.get(cname)
        pin = Pin(package=value.package, declared=value.version, installed=got.version if got else None)
        pins.append(pin)
        if got is None:
            fails.append(f"{value.package} {value.version} is not installed")
            continue
        if _same_pin(value.version, got.version):
            continue
        culprits = []
        for dist, req in _requirements_on(dists, cname):
            if not req.specifier.contains(value.version, prereleases=True):
                culprits.append(f"{dist.name} {dist.version} requires {str(req)!r}")
        for req in overrides:
            if canonicalize_name(req.name) == cname:
                culprits.append(f"install.overrides has {str(req)!r}")
        if not culprits:
            culprits = _who_asked(dists, cname)
        why = "; ".join(culprits) if culprits else "no installed package names it; check the index's versions"
        fails.append(f"{value.package} {value.version} was replaced by {got.version}; {why}")
        pins[-1] = dataclasses.replace(pin, culprits=tuple(culprits))

    # What `uv pip check` would say: a forced cell breaks its releases' own pins by design, and `compatlab
    # check` meets whatever was installed by hand. Warnings here; the import stage names the pin where the
    # module of the distribution that asked for it fails (runtime.run_import_stage).
    frozen: dict[str, str] = {
        canonicalize_name(line.split("==", 1)[0]): line.split("==", 1)[1].strip()
        for line in ctx.freeze
        if "==" in line and not line.startswith("#")
    }
    broken = [BrokenRequirement.from_json(b) for b in broken_requirements(dists, python_version_of(ctx.site), frozen)]

    declared = [v.package for v in ctx.cell.packages if v.package]
    clashes = owners.file_clashes(ctx.site, dists.values(), declared)
    for clash in clashes:
        (fails if clash.fails else warns).append(clash.describe())

    # CUDA majors: torch's build and every CUDA runtime package must agree with the cell's CUDA.
    cell_cuda = ctx.cell.cuda
    tcuda = torch_cuda(ctx.site, dists["torch"].version if "torch" in dists else None)
    found = PinsDetails(
        pins=tuple(pins),
        broken_requirements=tuple(broken),
        file_clashes=tuple(FileClash.from_json(c.to_json()) for c in clashes),
        torch_cuda=tcuda,
        cell_cuda=cell_cuda,
    )
    if cell_cuda is None:
        return _finish(fails, warns, found)
    cell_major = Version(cell_cuda).release[0]
    if tcuda is not None and Version(tcuda).release[0] != cell_major:
        fails.append(f"torch {dists['torch'].version} is a CUDA {tcuda} build; this cell is CUDA {cell_cuda}")
    by_major: dict[int, list[SiteDist]] = {}
    for dist in dists.values():
        major = cuda_major_of(dist.canonical, dist.version, _record_paths(dist))
        if major is not None:
            by_major.setdefault(major, []).append(dist)
    packages = {str(k): tuple(sorted(f"{d.name}=={d.version}" for d in v)) for k, v in by_major.items()}
    found = dataclasses.replace(found, cuda_packages=packages)
    families_in = {m: {_family(d.canonical) for d in ds} for m, ds in by_major.items()}
    targets = ctx.matrix.targets
    for major, ds in sorted(by_major.items()):
        if major == cell_major:
            continue
        for dist in ds:
            fam = _family(dist.canonical)
            # A package that ships one build per CUDA major side by side is not a mix.
            if fam != dist.canonical and fam in families_in.get(cell_major, set()):
                continue
            asked = _who_asked(dists, dist.canonical) or ["no installed package names it"]
            if len(asked) > 2:
                asked = [*asked[:2], f"{len(asked) - 2} more"]
            msg = (
                f"CUDA {major} package {dist.name} {dist.version} beside a CUDA {cell_cuda} stack ({'; '.join(asked)})"
            )
            needed = MIN_DRIVER.get(major) if major > cell_major else None
            if needed:
                msg += f": it needs a CUDA-{major} driver, {needed}+"
            else:
                msg += ": two CUDA runtimes may be loaded into one process"
            verdicts = [(t, _driver_ok(t.min_driver, needed)) if needed else (t, None) for t in targets]
            too_old = [t for t, ok in verdicts if ok is False]
            if too_old:
                fails.append(
                    msg
                    + "; target "
                    + ", ".join(f"{t.name} (min-driver {t.min_driver})" for t in too_old)
                    + " is older"
                )
            else:
                warns.append(msg)
    return _finish(fails, warns, found)


def _finish(fails: list[str], warns: list[str], found: PinsDetails) -> StageResult:
    warns = [*warns, *(b.text for b in found.broken_requirements)]  # after the CUDA warnings: those say more
    details = dataclasses.replace(found, failures=tuple(fails), warnings=tuple(warns)).to_details()
    if fails:
        more = f" (and {len(fails) - 1} more)" if len(fails) > 1 else ""
        return StageResult(name="pins", state=StageState.FAIL, reason=fails[0] + more, details=details)
    if warns:
        more = f" (and {len(warns) - 1} more)" if len(warns) > 1 else ""
        return StageResult(name="pins", state=StageState.WARN, reason=warns[0] + more, details=details)
    return StageResult(name="pins", state=StageState.PASS, details=details)
