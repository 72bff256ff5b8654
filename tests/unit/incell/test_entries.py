"""One module the import stage loaded, as the suite writes it and the lab reads it back."""

from __future__ import annotations

import json

import pytest

from compatlab.incell.entries import EntryError, ImportEntry


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
