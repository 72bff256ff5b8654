"""runs.records.environment: what incell/inspect_env.py prints, read as a typed record, from the module's own
output for this interpreter and from a whole inspection written out."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest

from compatlab.incell import inspect_env
from compatlab.runs.records.environment import InspectedDist, Inspection


def test_this_interpreters_inspection_reads_as_a_record() -> None:
    info = Inspection.from_json(json.loads(json.dumps(inspect_env.environment())))
    assert info.python == sys.executable
    assert info.version == ".".join(map(str, sys.version_info[:3]))
    assert info.is_venv is (sys.prefix != sys.base_prefix)
    assert info.pytest is True
    pytest_dist = next(d for d in info.dists if d.name.lower() == "pytest")
    assert pytest_dist.version == pytest.__version__
    assert pytest_dist.native == 0


def test_an_inspection_read_by_key() -> None:
    data: dict[str, Any] = {
        "python": "/e/bin/python",
        "version": "3.11.9",
        "prefix": "/e",
        "base_prefix": "/usr",
        "purelib": "/e/lib/python3.11/site-packages",
        "platlib": "/e/lib/python3.11/site-packages",
        "path": [],
        "pytest": False,
        "pip": 1,
        "dists": [
            {"name": "torch", "version": "2.9.1", "native": 40, "site": "/opt/site"},
            {"name": "sgl-kernel", "version": "0.3.21", "native": 2, "site": "/opt/site"},
            {"name": "flashinfer-python", "version": "0.6.4", "native": 1, "site": "/e/site"},
            {"name": "packaging", "version": "25.0", "native": 0, "site": "/e/site"},
            {"name": "lost", "version": "1", "native": 3, "site": ""},
        ],
        "problems": [["b-1.dist-info", "its RECORD cannot be read"], ["a-1.dist-info", "its METADATA cannot be read"]],
        "packages": {},
        "torch_version_py": "cuda = '13.0'\n",
    }
    info = Inspection.from_json(data)
    assert info.is_venv is True
    assert info.pip is True
    assert info.site == "/opt/site"  # most of the distributions with native code; one with no site is not counted
    assert info.dists[0] == InspectedDist(name="torch", version="2.9.1", native=40, site="/opt/site")
    assert info.problems == (
        ("a-1.dist-info", "its METADATA cannot be read"),
        ("b-1.dist-info", "its RECORD cannot be read"),
    )
    assert info.torch_version_py == "cuda = '13.0'\n"
    pure = Inspection.from_json({**data, "dists": data["dists"][3:4], "problems": []})
    assert pure.site == "/e/lib/python3.11/site-packages"  # no native code: purelib
    assert pure.problems == ()
