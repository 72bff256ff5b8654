"""What an interpreter is and sees, as one JSON object on stdout: run with the interpreter to be read.

``python -m compatlab.incell.inspect_env [NAME ...]`` (``proc.incell_command``) prints::

    {"python": sys.executable, "version": "3.11.9", "prefix": ..., "base_prefix": ..., "purelib": ...,
     "platlib": ..., "path": sys.path, "pytest": bool, "pip": bool,
     "dists": [{"name", "version", "native": shared objects its RECORD lists, "site"}, ...],
     "problems": [[the *.dist-info folder, what is wrong with it], ...],
     "packages": {NAME: its version, or null when it is not installed},
     "torch_version_py": the text of torch/version.py, or null}

Every distribution is listed once, the first on ``sys.path`` (the one ``import`` finds); one whose METADATA
or RECORD cannot be read is a problem of its own, and the others are still listed. ``compatlab check``
reads all of it (a caller that names distributions gets their versions in ``packages``). torch/version.py
says which CUDA torch was built for, read without importing torch.
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import json
import sys
import sysconfig
from collections.abc import Sequence
from typing import Any

__all__ = ["environment", "main"]


def _dists(problems: list[list[str]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for d in md.distributions():
        where = str(getattr(d, "_path", "") or "?").rsplit("/", 1)[-1]
        try:
            name = d.metadata["Name"]
            version = d.version
        except Exception as exc:  # noqa: BLE001 - one broken METADATA is that distribution's problem
            problems.append([where, f"its METADATA cannot be read ({type(exc).__name__}: {str(exc)[:200]})"])
            continue
        if not name or name.lower() in seen:
            continue  # the first on sys.path is the one `import` finds
        seen.add(name.lower())
        try:
            files = list(d.files or ())
        except Exception as exc:  # noqa: BLE001 - a blank RECORD line is a TypeError
            why = f"its RECORD cannot be read ({type(exc).__name__}: {str(exc)[:200]}); its files were not checked"
            problems.append([where, why])
            files = []
        native = 0
        for f in files:
            s = str(f)
            if (s.endswith(".so") or ".so." in s.rsplit("/", 1)[-1]) and not s.startswith(".."):
                native += 1
        try:
            site = str(d.locate_file(""))
        except Exception:  # noqa: BLE001 - a distribution that cannot say where it is has no site
            site = ""
        out.append({"name": name, "version": version, "native": native, "site": site})
    return out


def _torch_version_py() -> str | None:
    try:
        with open(str(md.distribution("torch").locate_file("torch/version.py")), encoding="utf-8") as fh:
            return fh.read()
    except Exception:  # noqa: BLE001 - no torch, or none that says its CUDA
        return None


def environment(names: Sequence[str] = ()) -> dict[str, Any]:
    """This interpreter and what it sees (the module's docstring), with the versions of *names*."""
    paths = sysconfig.get_paths()
    problems: list[list[str]] = []
    packages: dict[str, str | None] = {}
    for name in names:
        try:
            packages[name] = md.version(name)
        except md.PackageNotFoundError:
            packages[name] = None
    return {
        "python": sys.executable,
        "version": ".".join(str(v) for v in sys.version_info[:3]),
        "prefix": sys.prefix,
        "base_prefix": getattr(sys, "base_prefix", sys.prefix),
        "purelib": paths["purelib"],
        "platlib": paths["platlib"],
        "path": sys.path,
        "pytest": importlib.util.find_spec("pytest") is not None,
        "pip": importlib.util.find_spec("pip") is not None,
        "dists": _dists(problems),
        "problems": problems,
        "packages": packages,
        "torch_version_py": _torch_version_py(),
    }


def main(argv: Sequence[str] | None = None) -> int:
    print(json.dumps(environment(sys.argv[1:] if argv is None else argv)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
