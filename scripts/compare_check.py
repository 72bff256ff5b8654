"""Each module's verdict of `compatlab check` against a real import of it, in the environment it checked.

    python scripts/compare_check.py OUT/results.json --python ENV/bin/python [--json FILE] [-j N] [--cache DIR]

For every extension module the import stage judged, and every package it imported, this asks the checked
interpreter itself, one fresh process each: does the module load (imported by name, or loaded by path), does
its package import, and did that import map the module? Then:

- a module compatlab counts as a failure (red) that loads for real, or whose package imports without mapping
  it, is a **false red** (issue #14: red only for what ``import`` needs);
- a module compatlab counts as loaded that cannot load and that its package's import does not map is a
  **false green**;
- a package compatlab calls broken that imports for real, or the other way round, is a disagreement too.

Static findings that predict a load failure (a missing library, an undefined symbol or version) are compared
the same way; the other static findings (GPU arch, driver floor, families, libraries loaded by name) say
nothing an import on this machine can confirm and are listed apart. Standard library only, so it runs with
any Python beside the checked one. Prints the figures; exits 1 on any disagreement, 2 on bad input.

With ``--cache DIR`` the real imports' answers are kept in DIR and read again by a later run that would ask
the same: the same questions of the same interpreter, this script unchanged, and every file of the
environment's site-packages as it was (path, size, modification time), the system's library cache and
LD_LIBRARY_PATH too. A library changed outside those is not seen: keep the cache for an environment nothing
but its installer writes (the test suite's, which it builds once and keeps).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

LOAD_KINDS = ("library", "symbol", "version")  # static findings that predict a module cannot load
# the import stage's failure kinds that make a cell red (incell/loading/failure.py's STACK_KINDS)
RED_KINDS = ("undefined-symbol", "symbol-version", "missing-library", "import-error", "signal", "timeout", "exit")

_BY_PATH = (
    "import importlib.util, sys\n"
    "spec = importlib.util.spec_from_file_location(sys.argv[1], sys.argv[2])\n"
    "spec.loader.exec_module(importlib.util.module_from_spec(spec))\n"
)
_BY_NAME = (
    "import importlib, os, sys\n"
    "print(os.path.realpath(getattr(importlib.import_module(sys.argv[1]), '__file__', None) or ''))\n"
)
_MAPS = (
    "import importlib, os, sys\nimportlib.import_module(sys.argv[1])\n"
    "print('\\n'.join(sorted({os.path.realpath(l.split(None, 5)[5]) for l in open('/proc/self/maps')"
    " if len(l.split(None, 5)) == 6 and l.split(None, 5)[5].startswith('/')})))\n"
)


def _ok(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str] | None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return None
    return done if done.returncode == 0 else None


def _dotted(rel: str) -> str:
    """cv2/cv2.abi3.so -> cv2.cv2; mpi4py/MPI.mpich.cpython-312-x86_64-linux-gnu.so -> mpi4py.MPI"""
    return rel.rsplit(".so", 1)[0].split(".", 1)[0].replace("/", ".")


def _sites(python: str) -> list[Path]:
    done = subprocess.run(
        [
            python,
            "-c",
            "import sysconfig, json; p = sysconfig.get_paths(); print(json.dumps([p['purelib'], p['platlib']]))",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return [Path(p) for p in dict.fromkeys(json.loads(done.stdout))]


def truth(
    python: str,
    sites: list[Path],
    modules: list[tuple[str, str]],
    packages: list[str],
    *,
    jobs: int,
    timeout: float = 300.0,
) -> tuple[dict[str, bool], dict[str, set[str] | None]]:
    """({rel: loads alone, by name or by path}, {package: real paths its import maps, None if it fails})."""

    def alone(rel: str) -> bool:
        """This very file loads: by path, or imported by name where that name's import takes this file
        (`import mpi4py.MPI` takes whichever build mpi4py picks, not necessarily MPI.mpich)."""
        path = next((s / rel for s in sites if (s / rel).exists()), None)
        if path is None:
            return False
        if _ok([python, "-c", _BY_PATH, _dotted(rel), str(path)], timeout) is not None:
            return True
        done = _ok([python, "-c", _BY_NAME, _dotted(rel)], timeout)
        return done is not None and done.stdout.strip() == os.path.realpath(path)

    def maps(package: str) -> set[str] | None:
        done = _ok([python, "-c", _MAPS, package], timeout)
        return None if done is None else set(done.stdout.split("\n"))

    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        loads = dict(zip([rel for rel, _ in modules], pool.map(alone, [rel for rel, _ in modules]), strict=True))
        mapped = dict(zip(packages, pool.map(maps, packages), strict=True))
    return loads, mapped


def _fingerprint(python: str, sites: list[Path], modules: list[tuple[str, str]], packages: list[str]) -> str:
    """What the real imports' answers depend on, hashed: the questions, this script, the interpreter, every
    file under the site folders but bytecode (path, size, mtime), the system's library cache and LD_LIBRARY_PATH."""
    digest = hashlib.sha256()

    def add(*parts: object) -> None:
        digest.update(json.dumps(parts).encode() + b"\n")

    add(sorted(modules), sorted(packages), os.environ.get("LD_LIBRARY_PATH", ""))
    add(hashlib.sha256(Path(__file__).read_bytes()).hexdigest())
    for path in (os.path.realpath(python), "/etc/ld.so.cache"):
        try:
            stat = os.stat(path)
            add(path, stat.st_size, stat.st_mtime_ns)
        except OSError:
            add(path, None)
    for site in sites:
        for folder, dirs, files in os.walk(site):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")  # bytecode changes no answer
            for name in sorted(files):
                file = os.path.join(folder, name)
                try:
                    stat = os.lstat(file)
                except OSError:
                    continue
                add(os.path.relpath(file, site), stat.st_size, stat.st_mtime_ns)
    return digest.hexdigest()


def _cached_truth(
    cache: Path | None,
    python: str,
    sites: list[Path],
    modules: list[tuple[str, str]],
    packages: list[str],
    *,
    jobs: int,
) -> tuple[dict[str, bool], dict[str, set[str] | None], bool]:
    """``truth``'s answers, from *cache* where a run that asked the same kept them (then True), else asked
    now and kept there."""
    if cache is None:
        return (*truth(python, sites, modules, packages, jobs=jobs), False)
    kept = cache / f"truth-{_fingerprint(python, sites, modules, packages)[:32]}.json"
    try:
        data = json.loads(kept.read_text(encoding="utf-8"))
        return (
            {k: bool(v) for k, v in data["loads"].items()},
            {k: None if v is None else set(v) for k, v in data["mapped"].items()},
            True,
        )
    except (OSError, ValueError, KeyError, AttributeError, TypeError):
        pass  # none yet, or not readable: asked again
    loads, mapped = truth(python, sites, modules, packages, jobs=jobs)
    cache.mkdir(parents=True, exist_ok=True)
    partial = kept.with_name(f".{kept.name}.{os.getpid()}")
    partial.write_text(
        json.dumps({"loads": loads, "mapped": {k: None if v is None else sorted(v) for k, v in mapped.items()}}),
        encoding="utf-8",
    )
    os.replace(partial, kept)
    return loads, mapped, False


def _real(sites: list[Path], rel: str) -> set[str]:
    return {os.path.realpath(s / rel) for s in sites}


def compare(results: dict[str, Any], python: str, *, jobs: int, cache: Path | None = None) -> dict[str, Any]:
    [cell] = results["cells"]
    stages = {s["name"]: s for s in cell["stages"]}
    if "import" not in stages:
        raise SystemExit("error: the results have no import stage: run compatlab check without --until/--stages")
    entries = stages["import"].get("details", {}).get("modules", [])
    imported = sorted({e["module"] for e in entries if not e["module"].endswith(".so")}, key=len, reverse=True)
    static = stages.get("static", {}).get("details", {}).get("findings", [])
    static_red = {f["module"]: f["message"] for f in static if f["severity"] == "fail" and f["kind"] in LOAD_KINDS}
    others = sorted(
        {f"{f['module']}: {f['message']}" for f in static if f["severity"] == "fail" and f["kind"] not in LOAD_KINDS}
    )
    so = [e for e in entries if e["module"].endswith(".so")]
    # what static calls unloadable but the import stage did not load (a library; a module it did not find)
    so += [
        {"module": rel, "dist": "", "ok": False, "reason": f"static: {why}"}
        for rel, why in sorted(static_red.items())
        if rel not in {e["module"] for e in so}
    ]
    # a module's package: the longest imported package its dotted name is in (torch/_C -> torch,
    # functorch/_C -> functorch, cuda/core/cu12/_device -> cuda.core); else its distribution's first
    first: dict[str, str] = {}
    for e in entries:
        if not e["module"].endswith(".so"):
            first.setdefault(e["dist"], e["module"])
    packages = {
        e["module"]: next(
            (p for p in imported if (_dotted(e["module"]) + ".").startswith(p + ".")), first.get(e["dist"], "")
        )
        for e in so
    }
    started = time.monotonic()
    sites = _sites(python)
    loads, mapped, cached = _cached_truth(
        cache,
        python,
        sites,
        [(e["module"], packages[e["module"]]) for e in so],
        sorted(set(imported) | {p for p in packages.values() if p}),
        jobs=jobs,
    )
    false_red, false_green, agree = [], [], 0
    for e in so:
        red = (not e["ok"] and e.get("needed") is not False and e.get("failure", {}).get("kind") in RED_KINDS) or e[
            "module"
        ] in static_red
        package = packages[e["module"]]
        pkg_maps = mapped.get(package) if package else None
        maps_it = pkg_maps is not None and bool(_real(sites, e["module"]) & pkg_maps)
        loads_for_real = loads[e["module"]] or maps_it
        # red is right only for a module that cannot load and whose package's import fails (or it has none)
        if red and (loads_for_real or pkg_maps is not None):
            real = "loads" if loads_for_real else f"cannot load; `import {package}` works without it"
            false_red.append(
                {"module": e["module"], "real": real, "compatlab": e.get("verdict") or e.get("reason", "static fail")}
            )
        elif not red and e["ok"] and not loads_for_real:
            false_green.append(
                {
                    "module": e["module"],
                    "compatlab": e.get("loaded", "loaded"),
                    "real": "cannot load, and no package import maps it",
                }
            )
        else:
            agree += 1
    pkg_disagree = [
        {
            "package": p,
            "compatlab": "ok" if e["ok"] else e.get("reason", "fails"),
            "real": "imports" if mapped[p] is not None else "fails",
        }
        for e in entries
        if not e["module"].endswith(".so")
        for p in [e["module"]]
        if bool(e["ok"]) != (mapped[p] is not None)
    ]
    details = stages["import"].get("details", {})
    return {
        "cell": {"state": cell["state"], "reason": cell.get("reason", "")},
        "stages": {n: {"state": s["state"], "seconds": s.get("seconds")} for n, s in stages.items()},
        "modules": len(so),
        "packages": len(imported),
        "agree": agree,
        "false_red": false_red,
        "false_green": false_green,
        "packages_disagree": pkg_disagree,
        "warnings": details.get("warnings", [])
        + [f"static: {f['message']}" for f in static if f["severity"] == "warn"],
        "static_other_fails": others,
        "truth_seconds": round(time.monotonic() - started, 1),
        "truth": "cached" if cached else "ran",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path, help="results.json of `compatlab check --out DIR`")
    parser.add_argument("--python", required=True, help="the interpreter of the checked environment")
    parser.add_argument("--json", type=Path, help="also write the comparison here")
    parser.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--cache", type=Path, help="keep the real imports' answers here, for a run that asks the same")
    args = parser.parse_args(argv)
    try:
        results = json.loads(args.results.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        print(f"error: {args.results}: {exc}", file=sys.stderr)
        return 2
    out = compare(results, args.python, jobs=args.jobs, cache=args.cache)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    print(f"cell: {out['cell']['state']}: {out['cell']['reason']}")
    print("stages: " + ", ".join(f"{n} {s['state']} {s['seconds']} s" for n, s in out["stages"].items()))
    kept = ", its answers kept from an earlier run" if out["truth"] == "cached" else ""
    print(
        f"{out['modules']} shared objects and {out['packages']} packages compared with a real import "
        f"({out['truth_seconds']} s{kept}): {out['agree']} modules agree, {len(out['false_red'])} false red, "
        f"{len(out['false_green'])} false green, {len(out['packages_disagree'])} packages disagree"
    )
    for kind in ("false_red", "false_green", "packages_disagree"):
        for item in out[kind]:
            print(f"  {kind}: {json.dumps(item)}")
    for text in out["warnings"]:
        print(f"  warning: {text}")
    for text in out["static_other_fails"]:
        print(f"  static fail (not a load): {text}")
    return 1 if out["false_red"] or out["false_green"] or out["packages_disagree"] else 0


if __name__ == "__main__":
    sys.exit(main())
