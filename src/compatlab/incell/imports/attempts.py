"""What a package's import tried to load and could not, judged: the cause, a feature lost, or nothing.

The probe records each library the import tried to load (``ctypes.CDLL``, ``dlopen``, an extension module)
and how it went; each failed one is judged (ImportEntry.failed_loads' ``judged``):

- ``cause``: a file of the environment that failed on the stack (a missing library, an undefined symbol)
  while the import failed too: the load's error is the cause and the import's own exception the symptom
  (torchvision's ``_C.so`` with an undefined symbol, then "operator torchvision::nms does not exist");
- ``feature``: a file that failed while the import worked without it, or one of a folder of another package
  in which the import tried two or more libraries (torchcodec tries one build per FFmpeg major): what needs
  it will not work, a warning told once per folder;
- ``not-picked``: a build the package tried and passed over for another of the same folder, loaded right
  after it (one build per CUDA major, picked at run time);
- ``absent``: a bare name (``ctypes.CDLL("libfoo.so.1")``) or a file that is not there: the package looking
  for something this machine may lack, the import's own outcome saying whether that mattered.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from compatlab.incell.entries import ImportEntry
from compatlab.incell.imports.labels import site_label
from compatlab.incell.loading.failure import LoadFailure, classify_attempt, describe
from compatlab.incell.loading.installed import LoadTarget

__all__ = ["feature_warnings", "judge_attempts"]


def judge_attempts(
    target: LoadTarget, failure: LoadFailure | None, attempts: list[dict[str, Any]]
) -> tuple[LoadFailure | None, list[dict[str, Any]]]:
    """What a package's import tried to load and could not, judged (ImportEntry.failed_loads), and the
    import's failure, told by its real cause where a failed load was it.

    A file of the environment that failed to load is *needed* by the import that tried: when the import
    failed too, the load's error is the cause and the import's own exception the symptom (torchvision's
    ``_C.so`` with an undefined symbol, then "operator torchvision::nms does not exist"); when the import
    worked without it, what needs that library will not (a warning), unless the package loaded another
    build from the same folder right after it (one build per CUDA major, picked at run time: "not-picked").
    A bare name that did not load (``ctypes.CDLL("libfoo.so.1")``) is the package looking for something
    this machine may lack: "absent", the import's own outcome says whether that mattered.
    """
    judged: list[dict[str, Any]] = []
    cause: LoadFailure | None = None
    alternatives = _tried_alternatives(target, failure, attempts)
    for i, attempt in enumerate(attempts):
        lf = classify_attempt(attempt)
        if lf is None:
            continue
        name = str(attempt.get("name", ""))
        real = os.path.realpath(name) if os.path.isabs(name) else ""
        label = site_label(real) if real else name
        folder = os.path.dirname(real)
        picked = next(
            (
                str(b["name"])
                for b in attempts[i + 1 :]
                if b.get("ok")
                and os.path.isabs(str(b.get("name", "")))
                and real
                and os.path.dirname(os.path.realpath(str(b["name"]))) == folder
            ),
            None,
        )
        if not real or not os.path.isfile(real):
            verdict = "absent"
        elif picked is not None:
            verdict = "not-picked"
        elif failure is not None and lf.stack and folder not in alternatives:
            verdict = "cause"
            cause = cause or lf
        else:
            verdict = "feature"
        judged.append(
            {
                "name": label,
                "how": attempt.get("how", ""),
                "error": str(attempt.get("error", "")),
                "kind": lf.kind,
                "cause": lf.cause,
                "judged": verdict,
                **({"instead": site_label(os.path.realpath(picked))} if picked else {}),
            }
        )
    if failure is not None and cause is not None and cause.message not in failure.message:
        symptom = failure.message if failure.kind == "import-error" else describe(target.label, failure)
        failure = dataclasses.replace(
            cause, step=f"import {target.name}", outer=(symptom, *failure.outer), raw=failure.raw
        )
    return failure, judged


def _tried_alternatives(target: LoadTarget, failure: LoadFailure | None, attempts: list[dict[str, Any]]) -> set[str]:
    """Folders of another package in which the import tried two or more libraries that did not load (torchcodec
    tries one build per FFmpeg major; its other libraries load): that package looking for something optional. Such
    a folder is not why *target*'s import failed unless the failure names that package; its loads are told as
    a feature that will not work."""
    tried: dict[str, set[str]] = {}
    for attempt in attempts:
        name = str(attempt.get("name", ""))
        if os.path.isabs(name) and not attempt.get("ok"):
            real = os.path.realpath(name)
            tried.setdefault(os.path.dirname(real), set()).add(real)
    said = (failure.message + " " + " ".join(failure.outer)) if failure is not None else ""
    top = target.name.split(".", 1)[0]
    out = set()
    for folder, files in tried.items():
        owner = site_label(folder).split("/", 1)[0]
        if len(files) >= 2 and owner != top and owner not in said:
            out.add(folder)
    return out


def feature_warnings(entries: list[ImportEntry]) -> list[str]:
    """One warning per folder of libraries that imports tried, could not load and worked without: what
    needs them will not work (torchcodec tries one build per FFmpeg major; none loads without FFmpeg). Told
    once, by the first import that tried, however many imports tried the same files; a module of the stage
    whose own entry says it already (not needed: the import went on without it) is not told again."""
    seen: set[str] = {e.module for e in entries if not e.is_package and e.needed is False}
    out: list[str] = []
    for entry in entries:
        folders: dict[str, list[Mapping[str, Any]]] = {}
        for f in entry.failed_loads or ():
            if f.get("judged") == "feature" and f["name"] not in seen:
                seen.add(f["name"])
                folders.setdefault(os.path.dirname(f["name"]), []).append(f)
        for folder, failed in folders.items():
            first = failed[0]
            lf = classify_attempt({"ok": False, "error": first["error"], "name": first["name"]})
            what = describe(first["name"], lf) if lf is not None else first["name"]
            many = f"none of the {len(failed)} libraries it tried in {folder}/ loads: " if len(failed) > 1 else ""
            out.append(
                f"{entry.dist}: `import {entry.module}` works, but {many}{what}: what needs "
                f"{'them' if len(failed) > 1 else 'it'} will not work"
            )
    return out
