"""The pins stage: is every declared package installed as declared, and is there one CUDA major?"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from email.parser import HeaderParser
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from compatlab.incell.cudacompat import FAMILY_MIN_DRIVER
from compatlab.runs.model import StageResult
from compatlab.stages.base import CellContext

__all__ = ["Dist", "cuda_major_of", "read_dists", "run_pins_stage"]

# Oldest driver that runs each CUDA major (CUDA's release notes, "minimum required driver").
MIN_DRIVER = FAMILY_MIN_DRIVER


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Dist:
    name: str  # canonical
    display: str
    version: str
    requires: tuple[str, ...]
    path: Path


def read_dists(site_packages: Path) -> dict[str, Dist]:
    """Installed distributions of a site-packages directory, read from their METADATA files."""
    out: dict[str, Dist] = {}
    parser = HeaderParser()
    for meta in sorted(site_packages.glob("*.dist-info/METADATA")):
        msg = parser.parsestr(meta.read_text(encoding="utf-8", errors="replace"))
        name = msg.get("Name")
        version = msg.get("Version")
        if not name or not version:
            continue
        out[canonicalize_name(name)] = Dist(
            name=canonicalize_name(name), display=name, version=version,
            requires=tuple(msg.get_all("Requires-Dist") or ()), path=meta.parent,
        )
    return out


def _active(req: Requirement, extras: Iterable[str] = ()) -> bool:
    if req.marker is None:
        return True
    try:
        return any(req.marker.evaluate({"extra": e}) for e in ("", *extras))
    except Exception:  # noqa: BLE001 - an odd marker must not crash the stage
        return True


def _requirements_on(dists: dict[str, Dist], target: str) -> list[tuple[Dist, Requirement]]:
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
_TRACKS_CUDA = frozenset({
    "cuda-bindings", "cuda-python", "cuda-toolkit", "nvidia-cuda-runtime", "nvidia-cuda-nvrtc",
    "nvidia-cuda-cupti", "nvidia-cuda-nvcc", "nvidia-cublas", "nvidia-nvjitlink", "nvidia-nvtx",
})


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


def _record_paths(dist: Dist) -> list[str]:
    record = dist.path / "RECORD"
    if not dist.name.startswith("nvidia-") or not record.is_file():
        return []
    return [line.split(",", 1)[0] for line in record.read_text(encoding="utf-8", errors="replace").splitlines()]


def _family(name: str) -> str:
    return re.sub(r"-cu\d{2}$", "", name)


def cuda_of_torch(version_py: str | None, torch_version: str | None) -> str | None:
    """CUDA version torch was built for: its torch/version.py text, else its local tag (cu130 -> 13.0)."""
    if version_py and (m := re.search(r"^cuda\s*(?::\s*\S+)?\s*=\s*['\"]([\d.]+)['\"]", version_py, re.MULTILINE)):
        return m.group(1)
    if torch_version and (m := re.search(r"\+cu(\d+)(\d)$", torch_version)):
        return f"{int(m.group(1))}.{m.group(2)}"
    return None


def torch_cuda(site_packages: Path, dists: dict[str, Dist]) -> str | None:
    version_py = site_packages / "torch" / "version.py"
    torch = dists.get("torch")
    return cuda_of_torch(version_py.read_text() if version_py.is_file() else None, torch.version if torch else None)


def _who_asked(dists: dict[str, Dist], name: str) -> list[str]:
    return [f"{d.display} {d.version} requires {str(r)!r}" for d, r in _requirements_on(dists, name)]


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
    dists = read_dists(ctx.site)
    fails: list[str] = []
    warns: list[str] = []
    details: dict[str, object] = {}
    pins: list[dict[str, object]] = []
    overrides = [Requirement(o) for o in ctx.matrix.install.overrides]
    for value in ctx.cell.packages:
        assert value.package is not None
        cname = canonicalize_name(value.package)
        got = dists.get(cname)
        entry: dict[str, object] = {"package": value.package, "declared": value.version,
                                    "installed": got.version if got else None}
        pins.append(entry)
        if got is None:
            fails.append(f"{value.package} {value.version} is not installed")
            continue
        if _same_pin(value.version, got.version):
            continue
        culprits = []
        for dist, req in _requirements_on(dists, cname):
            if not req.specifier.contains(value.version, prereleases=True):
                culprits.append(f"{dist.display} {dist.version} requires {str(req)!r}")
        for req in overrides:
            if canonicalize_name(req.name) == cname:
                culprits.append(f"install.overrides has {str(req)!r}")
        if not culprits:
            culprits = _who_asked(dists, cname)
        why = "; ".join(culprits) if culprits else "no installed package names it; check the index's versions"
        fails.append(f"{value.package} {value.version} was replaced by {got.version}; {why}")
        entry["culprits"] = culprits
    details["pins"] = pins

    # CUDA majors: torch's build and every CUDA runtime package must agree with the cell's CUDA.
    cell_cuda = ctx.cell.cuda
    tcuda = torch_cuda(ctx.site, dists)
    details["torch_cuda"] = tcuda
    details["cell_cuda"] = cell_cuda
    if cell_cuda is None:
        return _finish(fails, warns, details)
    cell_major = Version(cell_cuda).release[0]
    if tcuda is not None and Version(tcuda).release[0] != cell_major:
        fails.append(f"torch {dists['torch'].version} is a CUDA {tcuda} build; this cell is CUDA {cell_cuda}")
    by_major: dict[int, list[Dist]] = {}
    for dist in dists.values():
        major = cuda_major_of(dist.name, dist.version, _record_paths(dist))
        if major is not None:
            by_major.setdefault(major, []).append(dist)
    details["cuda_packages"] = {str(k): sorted(f"{d.display}=={d.version}" for d in v) for k, v in by_major.items()}
    families_in = {m: {_family(d.name) for d in ds} for m, ds in by_major.items()}
    targets = ctx.matrix.targets
    for major, ds in sorted(by_major.items()):
        if major == cell_major:
            continue
        for dist in ds:
            fam = _family(dist.name)
            # A package that ships one build per CUDA major side by side is not a mix.
            if fam != dist.name and fam in families_in.get(cell_major, set()):
                continue
            asked = _who_asked(dists, dist.name) or ["no installed package names it"]
            if len(asked) > 2:
                asked = [*asked[:2], f"{len(asked) - 2} more"]
            msg = (f"CUDA {major} package {dist.display} {dist.version} beside a CUDA {cell_cuda} stack "
                   f"({'; '.join(asked)})")
            needed = MIN_DRIVER.get(major) if major > cell_major else None
            if needed:
                msg += f": it needs a CUDA-{major} driver, {needed}+"
            else:
                msg += ": two CUDA runtimes may be loaded into one process"
            verdicts = [(t, _driver_ok(t.min_driver, needed)) if needed else (t, None) for t in targets]
            too_old = [t for t, ok in verdicts if ok is False]
            if too_old:
                fails.append(msg + "; target " + ", ".join(f"{t.name} (min-driver {t.min_driver})" for t in too_old)
                             + " is older")
            else:
                warns.append(msg)
    return _finish(fails, warns, details)


def _finish(fails: list[str], warns: list[str], details: dict[str, object]) -> StageResult:
    details["failures"] = fails
    details["warnings"] = warns
    if fails:
        more = f" (and {len(fails) - 1} more)" if len(fails) > 1 else ""
        return StageResult(name="pins", state="fail", reason=fails[0] + more, details=details)
    if warns:
        more = f" (and {len(warns) - 1} more)" if len(warns) > 1 else ""
        return StageResult(name="pins", state="warn", reason=warns[0] + more, details=details)
    return StageResult(name="pins", state="pass", details=details)
