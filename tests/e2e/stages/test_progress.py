"""The import stage says where it is while it runs: modules loaded of all, and the slowest so far."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from compatlab.stages import runtime
from fixtures.existing import context_for
from fixtures.sofix import cc, ext_module


def _slow_venv(tmp: Path) -> Path:
    """A venv that sees the dev env's pytest, with 'slowpkg': one extension module, and an import of 1.5 s."""
    cc()
    venv = tmp / "cell"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = Path(next((venv / "lib").glob("python3*/site-packages")))
    (site / "devenv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n", encoding="utf-8")
    pkg = site / "slowpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("import time\ntime.sleep(1.5)\n", encoding="utf-8")
    ext_module(pkg, "fast")
    info = site / "slowpkg-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: slowpkg\nVersion: 1.0\n", encoding="utf-8")
    (info / "top_level.txt").write_text("slowpkg\n", encoding="utf-8")
    files = sorted(p.relative_to(site).as_posix() for p in pkg.rglob("*") if p.is_file())
    files += [f"slowpkg-1.0.dist-info/{n}" for n in ("METADATA", "top_level.txt", "RECORD")]
    (info / "RECORD").write_text("".join(f"{f},,\n" for f in files), encoding="utf-8")
    return venv


@pytest.mark.slow
def test_the_import_stage_prints_its_progress_unless_quiet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMPATLAB_PROGRESS_SECONDS", "0.25")  # 10 s in a cell
    venv = _slow_venv(tmp_path)
    heard: list[str] = []
    ctx = context_for(venv, packages=["slowpkg"], work_dir=tmp_path / "work")
    result = runtime.run_import_stage(dataclasses.replace(ctx, say=heard.append))
    assert result.details["total"] == 2, result.reason
    assert heard, "no progress line in 1.5 s"
    assert all(re.fullmatch(r"import: [0-2]/2 modules loaded(, slowest so far \S+ \d+\.\d s)?", h) for h in heard), (
        heard
    )
    # The extension module is done long before the package's import is.
    assert any(h.startswith("import: 1/2 modules loaded, slowest so far slowpkg/fast") for h in heard), heard
