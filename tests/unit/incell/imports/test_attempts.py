"""What a package's import tried to load and could not, judged: the cause, a feature lost, a build not
picked, or something this machine may lack."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from compatlab.incell.entries import ImportEntry
from compatlab.incell.imports.attempts import feature_warnings, judge_attempts
from compatlab.incell.loading.failure import LoadFailure
from compatlab.incell.loading.installed import LoadTarget

PKG = LoadTarget(dist="pkg", label="pkg", name="pkg")
NOT_THERE = "OSError: libfoo.so.1: cannot open shared object file: No such file or directory"


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.syspath_prepend(str(tmp_path))
    for rel in ("pkg/_C.so", "pkg/lib/libops_cu12.so", "pkg/lib/libops_cu13.so", "pkg/opt/libextra.so"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"")
    return tmp_path


def _attempt(name: str, error: str = "") -> dict[str, Any]:
    return {"name": name, "how": "ctypes.CDLL", "ok": not error, "error": error}


def test_a_failed_load_of_the_environment_is_the_cause_of_the_import_failing(site: Path) -> None:
    failure = LoadFailure(
        kind="import-error", message="RuntimeError: operator pkg::nms does not exist", step="import pkg"
    )
    undefined = f"OSError: {site}/pkg/_C.so: undefined symbol: PyUnicode_FromKindAndData"
    got, judged = judge_attempts(
        PKG, failure, [_attempt("libfoo.so.1", NOT_THERE), _attempt(f"{site}/pkg/_C.so", undefined)]
    )
    assert judged == [
        {
            "name": "libfoo.so.1",
            "how": "ctypes.CDLL",
            "error": NOT_THERE,
            "kind": "missing-library",
            "cause": "missing-library",
            "judged": "absent",
        },
        {
            "name": "pkg/_C.so",
            "how": "ctypes.CDLL",
            "error": undefined,
            "kind": "undefined-symbol",
            "cause": "python-abi",
            "judged": "cause",
        },
    ]
    assert got is not None
    assert (got.kind, got.symbol, got.step, got.outer) == (
        "undefined-symbol",
        "PyUnicode_FromKindAndData",
        "import pkg",
        ("RuntimeError: operator pkg::nms does not exist",),
    )


def test_a_build_passed_over_for_another_is_not_picked_and_one_the_import_did_without_a_feature(site: Path) -> None:
    missing = "OSError: libcudart.so.12: cannot open shared object file: No such file or directory"
    _failure, judged = judge_attempts(
        PKG,
        None,
        [
            _attempt(f"{site}/pkg/lib/libops_cu12.so", missing),
            _attempt(f"{site}/pkg/lib/libops_cu13.so"),
            _attempt(f"{site}/pkg/opt/libextra.so", missing),
        ],
    )
    assert _failure is None
    assert [(j["name"], j["judged"], j.get("instead")) for j in judged] == [
        ("pkg/lib/libops_cu12.so", "not-picked", "pkg/lib/libops_cu13.so"),
        ("pkg/opt/libextra.so", "feature", None),
    ]


def test_a_feature_lost_is_told_once_per_folder_by_the_first_import_that_tried() -> None:
    def tried(*names: str) -> tuple[dict[str, Any], ...]:
        error = "OSError: libavutil.so.58: cannot open shared object file: No such file or directory"
        return tuple({"name": n, "error": error, "judged": "feature"} for n in names)

    entries = [
        ImportEntry(
            module="codec", dist="codec", ok=True, failed_loads=tried("codec/libcore6.so", "codec/libcore7.so")
        ),
        ImportEntry(module="codec.io", dist="codec", ok=True, failed_loads=tried("codec/libcore6.so")),
    ]
    assert feature_warnings(entries) == [
        "codec: `import codec` works, but none of the 2 libraries it tried in codec/ loads: codec/libcore6.so: "
        "missing shared library libavutil.so.58: what needs them will not work"
    ]
