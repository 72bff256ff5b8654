"""Generate src/compatlab/data/driver_api.json: which CUDA version introduced each driver API entry point.

Read from a CUDA toolkit's headers (default: the newest /usr/local/cuda*/include):

- cudaTypedefs.h declares one ``PFN_<name>_v<NNNNN>`` per ABI version of every entry point; NNNNN is the
  CUDA version that introduced it (11020 = 11.2), with ``_ptds``/``_ptsz`` for the per-thread-stream forms;
- cuda.h maps each API name to the symbol the driver exports for its newest version
  (``#define cuCtxCreate cuCtxCreate_v4``); older versions are the lower suffixes, the oldest the bare name
  (cuCtxCreate: 2.0; _v2: 3.2; _v3: 11.4; _v4: 12.5).

Each CUDA version maps to a driver floor through ``compatlab.incell.cudacompat.TOOLKIT_DRIVER`` (the
driver each toolkit release shipped with): a driver older than that does not export what the release
added. Versions older than the oldest release in that table get no floor (every supported driver has them).

Usage: python scripts/gen_driver_api.py [--include DIR] [--out FILE]
"""

from __future__ import annotations

import argparse
import glob
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from compatlab.incell.cudacompat import TOOLKIT_DRIVER  # noqa: E402

_PFN = re.compile(r"\bPFN_(cu[A-Za-z0-9]+?)_v(\d{4,5})(_ptds|_ptsz)?\)")
_DEFINE = re.compile(
    r"^\s*#define\s+(cu[A-Za-z0-9]+)\s+(?:__CUDA_API_PT(?:DS|SZ)\()?(cu[A-Za-z0-9]+?)(?:_v(\d+))?\)?\s*$", re.M
)
_VERSION = re.compile(r"^#define CUDA_VERSION (\d+)", re.M)


def _cuda(number: int) -> tuple[int, int]:
    return number // 1000, (number % 1000) // 10


def driver_floor(cuda: tuple[int, int]) -> str | None:
    known = sorted(TOOLKIT_DRIVER)
    if cuda < known[0]:
        return None
    at_or_after = [k for k in known if k >= cuda]
    return TOOLKIT_DRIVER[at_or_after[0]] if at_or_after else None


def entry_points(cuda_h: str, typedefs_h: str) -> dict[str, tuple[int, int]]:
    versions: dict[str, set[int]] = {}
    threaded: dict[str, set[tuple[int, str]]] = {}
    for name, number, suffix in _PFN.findall(typedefs_h):
        if suffix:  # the per-thread-stream form of the newest version: its own CUDA version
            threaded.setdefault(name, set()).add((int(number), suffix))
        else:
            versions.setdefault(name, set()).add(int(number))
    current: dict[str, int] = {}
    for api, base, k in _DEFINE.findall(cuda_h):
        if api == base:
            current[api] = max(current.get(api, 1), int(k or 1))
    out: dict[str, tuple[int, int]] = {}
    for name, found in versions.items():
        ordered = sorted(found)
        top = current.get(name, 1)
        if len(ordered) > top and re.search(rf"\b{name}_v{len(ordered)}\s*\(", cuda_h):
            top = len(ordered)  # the newest is its own API (cuStreamGetCtx_v2), not what the bare name maps to
        symbol_of: dict[int, str] = {}
        for i, number in enumerate(ordered):
            k = top - (len(ordered) - 1 - i)
            if k < 1:
                continue  # older than the symbols this header still names
            symbol_of[number] = symbol = name if k == 1 else f"{name}_v{k}"
            out[symbol] = _cuda(number)
        # A per-thread-stream form belongs to the version of its number (cuMemPrefetchAsync_v12020_ptsz is
        # cuMemPrefetchAsync_v2_ptsz), or to the newest version older than it; its oldest number counts.
        for number, suffix in sorted(threaded.get(name, ())):
            older = [n for n in symbol_of if n <= number]
            if older:
                out.setdefault(symbol_of[max(older)] + suffix, _cuda(number))
    return out


def main() -> int:
    newest = sorted(glob.glob("/usr/local/cuda*/include/cuda.h"))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--include", type=Path, default=Path(newest[-1]).parent if newest else None)
    parser.add_argument("--out", type=Path, default=ROOT / "src" / "compatlab" / "data" / "driver_api.json")
    args = parser.parse_args()
    if args.include is None:
        parser.error("no CUDA toolkit headers found; pass --include DIR (the folder of cuda.h)")
    cuda_h = (args.include / "cuda.h").read_text(encoding="utf-8", errors="replace")
    typedefs_h = (args.include / "cudaTypedefs.h").read_text(encoding="utf-8", errors="replace")
    version = _VERSION.search(cuda_h)
    table = entry_points(cuda_h, typedefs_h)
    data = {
        "generated_by": "scripts/gen_driver_api.py",
        "from": f"cuda.h and cudaTypedefs.h of CUDA {'.'.join(map(str, _cuda(int(version.group(1)))))}"
        if version
        else "cuda.h and cudaTypedefs.h",
        "entry_points": {s: {"cuda": f"{c[0]}.{c[1]}", "driver": driver_floor(c)} for s, c in sorted(table.items())},
    }
    args.out.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n", encoding="utf-8")
    print(f"{args.out}: {len(table)} entry points from {args.include}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
