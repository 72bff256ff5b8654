"""The driver floor: entry points a module imports from libcuda that a target's min-driver does not export yet.

A module linked against libcuda.so.1 is loaded with RTLD_NOW by Python: an entry point the driver lacks is an
undefined symbol at import, on that driver. Which driver first exports each entry point is
``data/driver_api.json`` (``scripts/gen_driver_api.py``).
"""

from __future__ import annotations

import functools
import importlib.resources
import json
from collections.abc import Sequence
from typing import Any

from compatlab.runs.records.static import Finding, Kind, Severity
from compatlab.stages.static.elf import ElfInfo

__all__ = ["driver_covers", "driver_findings"]


@functools.cache
def _driver_api() -> dict[str, dict[str, Any]]:
    """data/driver_api.json: entry point -> the CUDA version and driver floor."""
    text = importlib.resources.files("compatlab").joinpath("data", "driver_api.json").read_text(encoding="utf-8")
    table: dict[str, dict[str, Any]] = json.loads(text)["entry_points"]
    return table


def driver_covers(min_driver: str, needed: str) -> bool:
    """At the precision the target gives: min-driver '570.26' covers 570.26.01."""
    have = tuple(int(p) for p in min_driver.split(".") if p.isdigit())
    need = tuple(int(p) for p in needed.split(".") if p.isdigit())
    return have >= need[: len(have)]


def driver_findings(rel: str, info: ElfInfo | None, min_drivers: Sequence[tuple[str, str]]) -> list[Finding]:
    """The module at *rel*, read as *info*, against each (target, min-driver) of *min_drivers*."""
    if not min_drivers or info is None or not {"libcuda.so.1", "libcuda.so"} & set(info.needed):
        return []
    table = _driver_api()
    out: list[Finding] = []
    for target, min_driver in min_drivers:
        newer = sorted(
            (
                (table[u.name]["driver"], u.name, table[u.name]["cuda"])
                for u in info.undefined
                if not u.weak
                and table.get(u.name, {}).get("driver")
                and not driver_covers(min_driver, table[u.name]["driver"])
            ),
            key=lambda t: (tuple(int(p) for p in t[0].split(".")), t[1]),
            reverse=True,
        )
        if not newer:
            continue
        driver, name, cuda = newer[0]
        more = f" (and {len(newer) - 1} more)" if len(newer) > 1 else ""
        who = f"target {target}'s" if target else "the"
        out.append(
            Finding(
                severity=Severity.FAIL,
                module=rel,
                kind=Kind.DRIVER_API,
                message=(
                    f"{rel} imports {name} from libcuda, an entry point of CUDA {cuda} (driver {driver} or "
                    f"newer){more}: {who} min-driver {min_driver} is older"
                ),
                details={
                    "target": target,
                    "min_driver": min_driver,
                    "entry_points": [{"symbol": n, "cuda": c, "driver": d} for d, n, c in newer],
                },
            )
        )
    return out
