"""The loader's log of a failed load: read from the plain server's own child, else loaded again in a watched one.

A gcc-built extension module whose C constructor dlopen()s a library that is not there: Python's import fails
without naming it, and only the loader's log (LD_DEBUG) tells. Both ways of reading it name the same library.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from compatlab.incell.imports.driver import Driver
from compatlab.incell.imports.loader import Loader
from compatlab.incell.loading.installed import LoadTarget

_BOOT = r"""
#include <dlfcn.h>
__attribute__((constructor)) static void boot(void) { dlopen("libcpl_missing.so.3", RTLD_NOW); }
int cpl_boot_marker(void) { return 1; }
"""


@pytest.fixture
def target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> LoadTarget:
    site = tmp_path / "site"
    (site / "cpl").mkdir(parents=True)
    (site / "cpl" / "__init__.py").write_text("", encoding="utf-8")
    source = tmp_path / "boot.c"
    source.write_text(_BOOT, encoding="utf-8")
    so = site / "cpl" / "_boot.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(so), str(source), "-ldl"], check=True, timeout=60)
    monkeypatch.syspath_prepend(str(site))  # labels are relative to the lab's sys.path (labels.site_label)
    monkeypatch.setenv("PYTHONPATH", str(site))  # and the servers import cpl from there
    return LoadTarget(dist="cpl", label="cpl/_boot.so", name="cpl._boot", path=str(so))


def _loader(tmp_path: Path) -> Loader:
    return Loader(Driver(str(tmp_path / "work"), []), pre=[], timeout=60, fork=True)


def test_a_failure_that_names_no_library_is_read_from_its_own_load_in_the_plain_server(
    target: LoadTarget, tmp_path: Path
) -> None:
    loader = _loader(tmp_path)
    try:
        failure, _done = loader.ask_plain(target)
        assert failure is not None
        assert failure.kind == "import-error", failure  # no PyInit_ function: Python says nothing of the dlopen
        found = loader.c_level(target)
        assert [name for name, _caller in found] == ["libcpl_missing.so.3"]
        assert found[0][1].endswith("cpl/_boot.so")
        assert loader.read_logged == 1
        assert loader.watched == {}  # no server of its own, no load again
        assert "with the loader's log on (read for 1 failure(s) that named no library)" in loader.describe()
    finally:
        loader.close()
    assert not any(log.exists() for log in loader.plain_logs.values())  # its folders go with it


def test_without_its_own_load_the_log_comes_from_a_watched_server_and_says_the_same(
    target: LoadTarget, tmp_path: Path
) -> None:
    loader = _loader(tmp_path)
    try:
        found = loader.c_level(target)  # no plain load before it: nothing recorded to read
        assert [name for name, _caller in found] == ["libcpl_missing.so.3"]
        assert loader.read_logged == 0
        assert [server is not None for server, _log in loader.watched.values()] == [True]  # started for it
    finally:
        loader.close()
