"""Load one module and say what Python said: the probe of the import stage, in a fresh interpreter or a fork.

``python -m compatlab.incell.probe PATH NAME PRE`` (``loadcheck.probe_command``) imports the prerequisites
PRE (comma-separated; an absolute path is a library, loaded with RTLD_GLOBAL), then loads the extension
module at PATH as NAME, or imports the package NAME when PATH is empty, and writes what happened as one
tagged JSON line on stderr, the last it writes::

    COMPATLAB-LOAD-RESULT {"ok": true, "step": "import torch", "mapped": [...], "attempts": [...]}
    COMPATLAB-LOAD-RESULT {"ok": false, "step": "load /x/m.so", "type": "OSError", "message": "...", "outer": [...]}

"attempts" is every shared object the import *tried* to load, in order, with its outcome: what the import
needs is observed, not guessed from names. Two doors cover what Python code loads: ``_imp.create_dynamic``
(every extension module, by ``import`` or by a loader given a path) and ``ctypes._dlopen``, which
``ctypes.CDLL``, ``ctypes.cdll.LoadLibrary`` and ``torch.ops.load_library`` all call (the audit event
``ctypes.dlopen`` fires there too, but before the load and without its outcome). Each is wrapped once per
process, before the first import; a failure the package catches (torchvision's ``_C.so`` with an undefined
symbol, then "operator torchvision::nms does not exist") is recorded with the loader's own words. Libraries a
C loader opens itself (dlopen from C++) are not seen here; the mapped list still shows those that loaded.

It exits 0 when the module loaded and 3 when it did not, through the interpreter's finalisation (a module
that crashes at exit is seen too). The fork server (``forkserver``) runs the same ``steps`` in its children;
``loading.failure.classify`` and ``loading.failure.classify_record`` read the record of either.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
import traceback
from collections.abc import Sequence
from typing import Any

__all__ = ["RESULT_TAG", "attempts", "main", "mapped_shared_objects", "observe", "root_cause", "steps"]

RESULT_TAG = "COMPATLAB-LOAD-RESULT "
MAX_ATTEMPTS = 400  # one import that tries more is recorded up to here, and says it was cut
_ERROR_CHARS = 600

_attempts: list[dict[str, Any]] = []
_observing = False


def _record(how: str, name: object, error: BaseException | None) -> None:
    if len(_attempts) > MAX_ATTEMPTS:
        return
    if len(_attempts) == MAX_ATTEMPTS:
        _attempts.append({"how": how, "name": "", "ok": False, "error": "cut: more load attempts than recorded"})
        return
    entry: dict[str, Any] = {"how": how, "name": os.fspath(name) if isinstance(name, (str, os.PathLike)) else ""}
    entry["ok"] = error is None
    if error is not None:
        entry["error"] = f"{type(error).__name__}: {error}"[:_ERROR_CHARS]
    _attempts.append(entry)


def observe() -> None:
    """Wrap the two doors every Python-level load goes through (the module's docstring), once."""
    global _observing  # noqa: PLW0603 - one process, one set of wrappers
    if _observing:
        return
    _observing = True
    import _imp
    import ctypes

    create = _imp.create_dynamic

    def create_dynamic(spec: Any, *args: Any) -> Any:
        try:
            module = create(spec, *args)
        except BaseException as exc:
            _record("extension", getattr(spec, "origin", None), exc)
            raise
        _record("extension", getattr(spec, "origin", None), None)
        return module

    _imp.create_dynamic = create_dynamic
    dlopen = ctypes._dlopen  # type: ignore[attr-defined]

    def observed_dlopen(name: Any, *args: Any) -> Any:
        try:
            handle = dlopen(name, *args)
        except BaseException as exc:
            _record("ctypes", name, exc)
            raise
        _record("ctypes", name, None)
        return handle

    ctypes._dlopen = observed_dlopen  # type: ignore[attr-defined]


def attempts() -> list[dict[str, Any]]:
    """The load attempts recorded since the last ``steps`` began, oldest first."""
    return list(_attempts)


def steps(pre: Sequence[str], path: str | None, name: str) -> dict[str, Any]:
    """Import *pre*, then load *path* as module *name* (or import package *name*), in this process; the
    record to report. A failure's traceback goes to stderr."""
    step = ""
    observe()
    try:
        for mod in pre:
            if os.path.isabs(mod):  # a library of the module's own package, loaded first as its package does
                import ctypes

                step = "preload " + mod
                ctypes.CDLL(mod, mode=ctypes.RTLD_GLOBAL)
                continue
            step = "import " + mod
            importlib.import_module(mod)
        _attempts.clear()  # what the prerequisites loaded is theirs, not the module's
        if path and name in sys.modules:
            # Loaded already by a prerequisite (torch._C by `import torch`): it linked and initialised, and
            # running its init a second time is something no package does.
            step = "load " + path
        elif path:
            step = "load " + path
            spec = importlib.util.spec_from_file_location(name, path)
            if spec is None or spec.loader is None:
                raise ImportError("no loader for " + path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        elif name:
            step = "import " + name
            importlib.import_module(name)
    except BaseException as exc:  # noqa: BLE001 - whatever the import raised is the verdict (SystemExit too)
        sys.stderr.write(traceback.format_exc())
        sys.stderr.flush()
        return {"ok": False, "step": step, **root_cause(exc), "attempts": attempts()}
    record: dict[str, Any] = {"ok": True, "step": step, "attempts": attempts()}
    if name and not path:  # what the import mapped: the shared objects its package's `import` needs
        mapped = mapped_shared_objects()
        if mapped is not None:
            record["mapped"] = mapped
    return record


def root_cause(exc: BaseException) -> dict[str, Any]:
    """The innermost cause of *exc* as {"type", "message"}, with the exceptions around it, outermost first,
    as "outer": [{"type", "message"}, ...] (absent when *exc* stands alone).

    A wrapper says where, its cause says why: torch's ``load_library`` raises ``OSError("Could not load
    this library: …")`` from the loader's "undefined symbol: …". The chain follows ``__cause__`` (``raise
    … from e``), and ``__context__`` (an exception raised while handling another) only where that other
    is an ImportError or OSError, what a failed load raises: a KeyError a fallback path handled is no cause.
    """
    chain = [exc]
    while len(chain) < 16:
        last = chain[-1]
        nxt = last.__cause__
        if nxt is None and not last.__suppress_context__ and isinstance(last.__context__, (ImportError, OSError)):
            nxt = last.__context__
        if nxt is None or nxt in chain:
            break
        chain.append(nxt)
    inner = chain[-1]
    out: dict[str, Any] = {"type": type(inner).__name__, "message": str(inner)}
    if len(chain) > 1:
        out["outer"] = [{"type": type(e).__name__, "message": str(e)} for e in chain[:-1]]
    return out


def mapped_shared_objects() -> list[str] | None:
    """The shared objects mapped into this process (/proc/self/maps): after `import P`, what P needed.
    None when that cannot be read.

    In a child of the fork server that includes what the server's own imports (torch) mapped.
    """
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as fh:
            paths = {parts[5].strip() for parts in (line.split(None, 5) for line in fh) if len(parts) == 6}
    except OSError:
        return None
    return sorted(p for p in paths if p.startswith("/") and (p.endswith(".so") or ".so." in p))


def _die_with_parent() -> None:
    """Linux's parent-death signal: a probe outlives no suite (one killed outright takes its loads along)."""
    import ctypes
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (AttributeError, OSError):
        return


def main(argv: Sequence[str] | None = None) -> int:
    """``PATH NAME PRE``: the probe (the module's docstring)."""
    if argv is None:
        _die_with_parent()
    path, name, pre = sys.argv[1:4] if argv is None else argv
    record = steps([m for m in pre.split(",") if m], path or None, name)
    sys.stderr.write(RESULT_TAG + json.dumps(record) + "\n")
    sys.stderr.flush()
    return 0 if record["ok"] else 3


if __name__ == "__main__":
    raise SystemExit(main())
