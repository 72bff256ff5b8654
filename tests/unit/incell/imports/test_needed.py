"""Whether a failed module is needed: what static left the import stage to decide is decided, or stays red; a
module its package's import maps loads; a module no import of its distribution tried is not needed."""

from __future__ import annotations

import json
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
