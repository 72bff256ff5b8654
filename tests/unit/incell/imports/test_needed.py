"""Whether a failed module is needed: what static left the import stage to decide is decided, or stays red; a
module its package's import maps loads; a module no import of its distribution tried is not needed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from compatlab.incell.entries import ImportEntry
from compatlab.incell.imports import needed


def test_a_module_static_left_undecided_and_nobody_loaded_stays_red(tmp_path: Path) -> None:
    (tmp_path / "static").mkdir()
    (tmp_path / "static" / "not-needed.json").write_text(
        json.dumps(
            {
                "pkg/_lazy.so": {"package": "pkg", "why": "only imported inside f()", "feature": "", "needed": "no"},
                "pkg/_named.so": {
                    "package": "pkg",
                    "why": "pkg/__init__.py names '_named'",
                    "feature": "",
                    "needed": "unknown",
                },
                "pkg/_seen.so": {
                    "package": "pkg",
                    "why": "pkg/__init__.py names '_seen'",
                    "feature": "",
                    "needed": "unknown",
                },
            }
        ),
        encoding="utf-8",
    )
    entries = [ImportEntry(module="pkg/_seen.so", dist="pkg", ok=True)]
    assert needed.undecided(needed.predicted(str(tmp_path)), entries) == [
        "pkg/_named.so: static could not tell whether `import pkg` needs it, and the import stage did not load it"
    ]
    assert needed.predicted(str(tmp_path / "nowhere")) is None  # no static stage ran
    assert needed.undecided(needed.predicted(str(tmp_path / "nowhere")), entries) == []


def test_a_module_that_fails_alone_but_its_package_maps_counts_as_loaded() -> None:
    failure = {"kind": "import-error", "message": "ImportError: wrong name"}
    entries = needed.loaded_by_package(
        [
            ImportEntry(
                module="cv2/cv2.abi3.so",
                dist="opencv",
                ok=False,
                failure=failure,
                reason="cv2/cv2.abi3.so: ImportError: wrong name",
            ),
            ImportEntry(
                module="cv2/other.abi3.so",
                dist="opencv",
                ok=False,
                failure=failure,
                reason="cv2/other.abi3.so: ImportError: wrong name",
            ),
            ImportEntry(module="cv2", dist="opencv", ok=True, mapped=("cv2/cv2.abi3.so",)),
        ]
    )
    assert entries[0].to_json() == {
        "module": "cv2/cv2.abi3.so",
        "dist": "opencv",
        "ok": True,
        "seconds": 0.0,
        "alone": failure,
        "loaded": ("by `import cv2`, which maps it; loaded alone, cv2/cv2.abi3.so: ImportError: wrong name"),
    }
    assert entries[1].ok is False  # not mapped: the failure stands


def _broken(module: str, dist: str = "pkg", kind: str = "undefined-symbol") -> ImportEntry:
    failure = {"kind": kind, "message": "m"}
    return ImportEntry(module=module, dist=dist, ok=False, failure=failure, reason=f"{module}: undefined symbol f")


def test_a_failed_module_is_needed_when_an_import_of_its_distribution_tried_it_or_failed() -> None:
    tried = {"name": "pkg/_b.so", "judged": "cause"}
    entries = [
        _broken("pkg/_a.so"),
        _broken("pkg/_b.so"),
        ImportEntry(module="pkg", dist="pkg", ok=True, mapped=("pkg/_a.so",), failed_loads=(tried,)),
        _broken("solo/_x.so", "solo"),
        _broken("bad/_y.so", "bad"),
        ImportEntry(module="bad", dist="bad", ok=False),
        _broken("pkg/_gpu.so", kind="no-driver"),  # not the stack's: a GPU judges it
    ]
    got = needed.confirm_not_needed(None, entries)
    assert [e.needed_why for e in got] == [
        "`import pkg` loads it",
        "`import pkg` tried to load it and failed on it",
        None,
        "solo has no package to import it: it is loaded alone",
        "`import bad` did not load, so it may need it",
        None,
        None,
    ]
    assert [e.needed for e in got] == [None] * len(entries)


def test_a_module_a_working_import_tried_and_went_on_without_is_not_needed() -> None:
    # cupy's import tries cupy_backends/cuda/libs/cutensor.so (libcutensor.so.2 absent), goes on without it and
    # works: a feature lost, a warning. Where that failed load failed the import (cause), or the import failed,
    # it stays needed.
    entries = [
        _broken("pkg/_opt.so", kind="missing-library"),
        _broken("pkg/_cu12.so", kind="missing-library"),
        ImportEntry(
            module="pkg",
            dist="pkg",
            ok=True,
            mapped=("pkg/_cu13.so",),
            failed_loads=(
                {"name": "pkg/_opt.so", "judged": "feature"},
                {"name": "pkg/_cu12.so", "judged": "not-picked", "instead": "pkg/_cu13.so"},
            ),
        ),
        _broken("bad/_core.so", "bad", kind="missing-library"),
        ImportEntry(module="bad", dist="bad", ok=False, failed_loads=({"name": "bad/_core.so", "judged": "feature"},)),
        _broken("cause/_c.so", "cause"),
        ImportEntry(module="cause", dist="cause", ok=True, failed_loads=({"name": "cause/_c.so", "judged": "cause"},)),
    ]
    host_code = dict.fromkeys(("pkg/_opt.so", "pkg/_cu12.so"), sys.executable)  # no device code: no GPU picks them
    got = needed.confirm_not_needed({}, entries, None, host_code)
    assert [(e.module, e.needed, e.needed_why) for e in got if not e.is_package] == [
        ("pkg/_opt.so", False, None),
        ("pkg/_cu12.so", False, None),
        ("bad/_core.so", None, "`import bad` tried to load it and failed on it"),
        ("cause/_c.so", None, "`import cause` tried to load it and failed on it"),
    ]
    assert got[0].verdict == (
        "pkg/_opt.so: undefined symbol f; `import pkg` does not need it: it tried to load it and went on without it "
        "(what needs it will not work)"
    )


def test_a_failed_module_no_import_tried_is_not_needed_saying_what_its_package_says_of_it() -> None:
    predicted = {
        "pkg/_lazy.so": {
            "package": "pkg",
            "why": "only imported inside f()",
            "feature": "the fast path",
            "needed": "no",
        },
        "pkg/_named.so": {
            "package": "pkg",
            "why": "pkg/__init__.py names '_named'",
            "feature": "",
            "needed": "unknown",
        },
    }
    entries = [
        _broken("pkg/_lazy.so"),
        _broken("pkg/_named.so"),
        _broken("pkg/_plain.so"),
        _broken("pkg/_device.so"),  # no file to read: it may carry device code
        ImportEntry(module="pkg", dist="pkg", ok=True, mapped=()),
    ]
    got = needed.confirm_not_needed(predicted, entries, None, {"pkg/_plain.so": sys.executable})
    assert [(e.needed, e.verdict, e.needed_why) for e in got[:4]] == [
        (
            False,
            "pkg/_lazy.so: undefined symbol f; `import pkg` does not need it: it loads without mapping it (only "
            "imported inside f()); pkg says it is for: the fast path",
            None,
        ),
        (
            False,
            "pkg/_named.so: undefined symbol f; `import pkg` does not need it here: it loads without mapping it, "
            "though pkg/__init__.py names '_named'",
            None,
        ),
        (
            False,
            "pkg/_plain.so: undefined symbol f; `import pkg` does not need it: it loads without trying to load it",
            None,
        ),
        (
            None,
            None,
            "a build its package may pick by GPU: whether `import pkg` loads it here says nothing of the target's GPU",
        ),
    ]


def test_a_package_import_keeps_what_it_mapped_of_its_own_distribution() -> None:
    owned = {"pkg": {"/site/pkg/_a.so": "pkg/_a.so", "/site/pkg/_b.so": "pkg/_b.so"}}
    loaded: list[tuple[ImportEntry, list[str] | None]] = [
        (ImportEntry(module="pkg/_a.so", dist="pkg", ok=True), None),
        (ImportEntry(module="pkg", dist="pkg", ok=True), ["/site/pkg/_b.so", "/usr/lib/libc.so.6", "/site/pkg/_a.so"]),
    ]
    got = needed.own_mapped(loaded, owned)
    assert [e.mapped for e in got] == [None, ("pkg/_a.so", "pkg/_b.so")]
