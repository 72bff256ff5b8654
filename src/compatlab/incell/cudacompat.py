"""Which driver a CUDA build needs, and which GPU archs a list of compiled archs covers. Pure logic.

Figures are NVIDIA's (CUDA Toolkit release notes, "CUDA Toolkit and Corresponding Driver Versions", Linux).
A build for CUDA X.Y runs on any driver of its major's floor or newer (minor-version compatibility), but PTX
made by X.Y is JIT-compiled only by a driver at least as new as the one X.Y shipped with.
"""

from __future__ import annotations

import dataclasses
import re

__all__ = [
    "FAMILY_MIN_DRIVER",
    "TOOLKIT_DRIVER",
    "Arch",
    "ArchCoverage",
    "DriverCheck",
    "arch_covers",
    "check_driver",
    "check_driver_api",
    "check_min_driver",
    "parse_arch",
    "parse_driver",
]

# Oldest driver that runs any build of a CUDA major (minor-version compatibility).
FAMILY_MIN_DRIVER: dict[int, str] = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}
# The driver each toolkit release shipped with: new enough for everything that release makes, PTX included.
TOOLKIT_DRIVER: dict[tuple[int, int], str] = {
    (11, 8): "520.61.05",
    (12, 0): "525.60.13",
    (12, 1): "530.30.02",
    (12, 2): "535.54.03",
    (12, 3): "545.23.06",
    (12, 4): "550.54.14",
    (12, 5): "555.42.02",
    (12, 6): "560.28.03",
    (12, 8): "570.26",
    (12, 9): "575.51.03",
    (13, 0): "580.65.06",
    (13, 1): "590.44.01",
}


def parse_driver(text: str) -> tuple[int, ...]:
    """'580.159.03' -> (580, 159, 3); ValueError for anything else."""
    if not re.fullmatch(r"\d+(\.\d+){0,2}", text.strip()):
        raise ValueError(f"not a driver version: {text!r}")
    return tuple(int(p) for p in text.strip().split("."))


def _cuda(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"(\d+)(?:\.(\d+))?(?:\.\d+)*", text.strip())
    if not m:
        raise ValueError(f"not a CUDA version: {text!r}")
    return int(m.group(1)), int(m.group(2) or 0)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class DriverCheck:
    """Verdict on one driver for one CUDA version: pass, warn (runs with limits) or fail."""

    state: str
    reason: str
    minimum: str | None = None  # the family floor
    recommended: str | None = None  # the driver the toolkit shipped with


def check_driver(driver: str, cuda: str) -> DriverCheck:
    """Can driver *driver* (e.g. '580.159.03') run builds for CUDA *cuda* (e.g. '13.0')?"""
    have = parse_driver(driver)
    major, minor = _cuda(cuda)
    floor = FAMILY_MIN_DRIVER.get(major)
    if floor is None:
        return DriverCheck(state="warn", reason=f"no driver table for CUDA {major}.x; driver {driver} not checked")
    shipped = TOOLKIT_DRIVER.get((major, minor))
    if have < parse_driver(floor):
        return DriverCheck(
            state="fail",
            minimum=floor,
            recommended=shipped,
            reason=f"driver {driver} is too old for CUDA {major}.{minor}: CUDA {major}.x needs {floor} or newer",
        )
    if shipped is not None and have < parse_driver(shipped):
        return DriverCheck(
            state="warn",
            minimum=floor,
            recommended=shipped,
            reason=(
                f"driver {driver} runs CUDA {major}.{minor} builds only under minor-version compatibility: "
                f"PTX from CUDA {major}.{minor} needs {shipped} or newer"
            ),
        )
    return DriverCheck(
        state="pass", minimum=floor, recommended=shipped, reason=f"driver {driver} supports CUDA {major}.{minor}"
    )


def check_driver_api(api_version: int, cuda: str) -> DriverCheck:
    """Check cuDriverGetVersion's answer (13000 = CUDA 13.0) against CUDA *cuda*."""
    major, minor = _cuda(cuda)
    have = (api_version // 1000, (api_version % 1000) // 10)
    shown = f"{have[0]}.{have[1]}"
    if have[0] < major:
        return DriverCheck(
            state="fail", reason=f"the driver supports CUDA {shown}, older than the cell's CUDA {major}.{minor}"
        )
    if have < (major, minor):
        return DriverCheck(
            state="warn",
            reason=f"the driver supports CUDA {shown}; CUDA {major}.{minor} runs under "
            "minor-version compatibility only",
        )
    return DriverCheck(state="pass", reason=f"the driver supports CUDA {shown}")


def check_min_driver(driver: str, min_driver: str, target: str) -> DriverCheck:
    """The matrix target's own floor (``min-driver``)."""
    if parse_driver(driver) < parse_driver(min_driver):
        return DriverCheck(
            state="fail",
            minimum=min_driver,
            reason=f"driver {driver} is older than target {target}'s min-driver {min_driver}",
        )
    return DriverCheck(
        state="pass", minimum=min_driver, reason=f"driver {driver} meets target {target}'s min-driver {min_driver}"
    )


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Arch:
    kind: str  # "sm" (machine code) or "compute" (PTX)
    major: int
    minor: int
    suffix: str  # "", "a" (this exact arch) or "f" (this family)

    def __str__(self) -> str:
        return f"{self.kind}_{self.major}{self.minor}{self.suffix}"


def parse_arch(text: str) -> Arch:
    """'sm_90a' -> Arch(sm, 9, 0, 'a'); also 'compute_120', '9.0' and '90'."""
    t = text.strip().lower()
    if m := re.fullmatch(r"(\d+)\.(\d)", t):
        return Arch(kind="sm", major=int(m.group(1)), minor=int(m.group(2)), suffix="")
    m = re.fullmatch(r"(?:(sm|compute)_)?(\d+)(\d)([af]?)", t)
    if not m:
        raise ValueError(f"not a GPU arch: {text!r}")
    return Arch(kind=m.group(1) or "sm", major=int(m.group(2)), minor=int(m.group(3)), suffix=m.group(4))


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ArchCoverage:
    """How a device is covered: by machine code ('sass') or by PTX the driver compiles ('ptx')."""

    kind: str
    by: str


def runs_on_device(code: Arch, device: tuple[int, int]) -> bool:
    """Whether code for *code* runs on a device of compute capability *device*: the one rule of the lab."""
    dmaj, dmin = device
    if code.suffix == "a":  # arch-specific features: that arch only
        return (code.major, code.minor) == (dmaj, dmin)
    if code.kind == "compute" and not code.suffix:  # PTX: JIT-compiled for any newer device
        return (code.major, code.minor) <= (dmaj, dmin)
    # Machine code (and family-specific PTX) runs within its major, on the same or a later minor.
    return code.major == dmaj and code.minor <= dmin


def arch_covers(device: tuple[int, int], archs: list[str]) -> ArchCoverage | None:
    """Does code compiled for *archs* run on a device of compute capability *device*?"""
    parsed = []
    for text in archs:
        try:
            parsed.append(parse_arch(text))
        except ValueError:
            continue
    for want in ("sm", "compute"):
        for code in parsed:
            if code.kind == want and runs_on_device(code, device):
                return ArchCoverage(kind="sass" if want == "sm" else "ptx", by=str(code))
    return None
