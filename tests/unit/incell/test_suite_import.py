"""The import suite's bookkeeping: what static left it to decide is decided, or stays red."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from compatlab.incell.entries import EntryError, ImportEntry
from compatlab.incell.suites import test_import as suite


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
    assert suite._undecided(suite._predicted(str(tmp_path)), entries) == [
        "pkg/_named.so: static could not tell whether `import pkg` needs it, and the import stage did not load it"
    ]
    assert suite._predicted(str(tmp_path / "nowhere")) is None  # no static stage ran
    assert suite._undecided(suite._predicted(str(tmp_path / "nowhere")), entries) == []


def test_a_module_that_fails_alone_but_its_package_maps_counts_as_loaded() -> None:
    failure = {"kind": "import-error", "message": "ImportError: wrong name"}
    entries = suite._loaded_by_package(
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


def test_an_entry_survives_json_and_a_key_it_does_not_know_is_refused() -> None:
    entry = ImportEntry(
        module="pkg/_ops.so",
        dist="pkg",
        ok=False,
        seconds=0.25,
        failure={"kind": "undefined-symbol", "symbol": "_ZN2ns5checkEi"},
        reason="pkg/_ops.so: undefined symbol ns::check(int)",
        needed=False,
        verdict="pkg/_ops.so: undefined symbol ns::check(int); `import pkg` does not need it",
    )
    assert ImportEntry.from_json(json.loads(json.dumps(entry.to_json()))) == entry
    assert "mapped" not in entry.to_json()  # a key left out is None, as the suite always wrote it
    with pytest.raises(EntryError, match=r"^a modules entry of 'pkg': unknown keys \['mapped_paths'\], missing \[\]$"):
        ImportEntry.from_json({"module": "pkg", "dist": "pkg", "ok": True, "mapped_paths": []})
