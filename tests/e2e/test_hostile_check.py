"""`compatlab check` over an environment where one distribution is broken: a METADATA that is not UTF-8, a
RECORD with a blank line. The broken one is reported for itself; the others are still read and checked.
And a check stopped by SIGTERM takes what it started down with it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

from compatlab.existing import inspect_environment
from compatlab.incell.loading.installed import Installed


def _dist_info(site: Path, name: str, *, metadata: bytes | None = None, record: str | None = None) -> None:
    info = site / f"{name}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_bytes(metadata or f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n".encode())
    (info / "RECORD").write_text(
        record or f"{name}/__init__.py,,\n{name}/_c.abi3.so,,\n{info.name}/RECORD,,\n", encoding="utf-8"
    )


def _broken_site(root: Path) -> Path:
    site = root / "site"
    site.mkdir()
    _dist_info(site, "blankrecord", record="blankrecord/__init__.py,,\n\nblankrecord-1.0.dist-info/RECORD,,\n")
    _dist_info(site, "latin", metadata=b"Metadata-Version: 2.1\nName: latin\nVersion: 1.0\nSummary: caf\xe9\n")
    _dist_info(site, "fine")
    return site


def test_check_reads_the_environment_and_names_the_broken_distributions(tmp_path: Path) -> None:
    venv = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = Path(next((venv / "lib").glob("python3*/site-packages")))
    for item in _broken_site(tmp_path).iterdir():
        item.rename(site / item.name)
    env = inspect_environment(venv / "bin" / "python")
    assert env.dists == {"blankrecord": "1.0", "fine": "1.0"}
    assert env.native == ("fine",)
    assert [(w, why.split(" (", 1)[0]) for w, why in env.problems] == [
        ("blankrecord-1.0.dist-info", "its RECORD cannot be read"),
        ("latin-1.0.dist-info", "its METADATA cannot be read"),
    ]
    assert env.problems[1][1].startswith(
        "its METADATA cannot be read (UnicodeDecodeError: 'utf-8' codec can't decode byte 0xe9"
    )


def test_a_whole_check_over_undecodable_metadata_still_gives_the_environments_verdict(tmp_path: Path) -> None:
    venv = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = Path(next((venv / "lib").glob("python3*/site-packages")))
    for item in _broken_site(tmp_path).iterdir():
        item.rename(site / item.name)
    (site / "fine").mkdir()
    (site / "fine" / "__init__.py").write_text("")
    done = subprocess.run(
        [sys.executable, "-m", "compatlab", "check", "--venv", str(venv), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
        env={**os.environ, "COMPATLAB_CACHE": str(tmp_path / "cache")},
    )
    assert done.returncode == 0, done.stdout + done.stderr  # amber on a machine without a GPU: no news
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [c["state"] for c in results["cells"]] == ["partial"]
    rows = {
        line.split(" | ")[0].strip("| "): line for line in (tmp_path / "out" / "packages.md").read_text().splitlines()
    }
    assert rows["fine"] == "| fine | 1.0 | pass | 1 |  |"
    assert rows["latin-1.0.dist-info"].startswith(
        "| latin-1.0.dist-info | ? | warn | 0 | metadata: its METADATA cannot be read (UnicodeDecodeError: "
    )


def test_the_import_stage_reads_a_broken_distribution_as_far_as_it_can(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(_broken_site(tmp_path)))
    blank = Installed("blankrecord")
    assert (blank.version, blank.files, blank.targets) == ("1.0", [], [])
    assert blank.problem.startswith("its RECORD cannot be read (TypeError: ")
    latin = Installed("latin")
    assert latin.version == "?"
    assert latin.problem.startswith("its METADATA cannot be read (UnicodeDecodeError: ")
    assert Installed("fine").problem == ""


def _gone(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text(encoding="utf-8")
    except OSError:
        return True
    return "\nState:\tZ" in status  # a zombie no one reaps (a container's init may not) has stopped all the same


def test_sigterm_to_check_stops_its_pytest_and_what_it_loads(tmp_path: Path) -> None:
    venv = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = Path(next((venv / "lib").glob("python3*/site-packages")))
    (site / "devenv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n", encoding="utf-8")  # its pytest
    pidfile = tmp_path / "loading.pid"
    (site / "sleepy").mkdir()
    (site / "sleepy" / "__init__.py").write_text(
        f"import os, time\nopen({str(pidfile)!r}, 'w').write(str(os.getpid()))\ntime.sleep(120)\n", encoding="utf-8"
    )
    _dist_info(site, "sleepy", record="sleepy/__init__.py,,\nsleepy-1.0.dist-info/RECORD,,\n")
    argv = [
        sys.executable,
        "-m",
        "compatlab",
        "check",
        "--venv",
        str(venv),
        "--package",
        "sleepy",
        "--out",
        str(tmp_path / "out"),
    ]
    env = {**os.environ, "COMPATLAB_CACHE": str(tmp_path / "cache")}
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    loading = 0
    try:
        deadline = time.monotonic() + 60
        while not (pidfile.is_file() and pidfile.read_text()) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert pidfile.is_file(), "the import stage never started loading sleepy"
        loading = int(pidfile.read_text())
        proc.send_signal(signal.SIGTERM)  # check alone, as a CI runner's cancel does
        out, _ = proc.communicate(timeout=30)
        deadline = time.monotonic() + 10
        while not _gone(loading) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _gone(loading), "the module check was loading still runs after check was stopped"
        assert proc.returncode == 128 + signal.SIGTERM, out.decode(errors="replace")[-2000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        if loading and not _gone(loading):
            os.kill(loading, signal.SIGKILL)
