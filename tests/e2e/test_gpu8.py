"""`nox -s gpu8_perf` end to end on a CPU: a cell with a real (CPU) torch, NCCL's gloo path, and EAGLE-3
against a baseline served by stand-in SGLang servers on loopback."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from fixtures.labutil import ROOT, nox

CPU_TORCH = sorted(Path("/opt/wheels").glob("torch-2.13.0+cpu-cp311-*.whl")) if sys.version_info[:2] == (3, 11) else []
SERVER = "import sys; sys.path.insert(0, {src!r}); from fixtures.standin_server import main; sys.exit(main())"

MATRIX = """
name = "gpu8"
[[axes.torch]]
version = "2.13.0+cpu"
find-links = "file:///opt/wheels"
[[axes.sgl-kernel]]
version = "0.3.21"
index = "{url}/public/simple"
[[axes.flashinfer]]
version = "0.6.4"
index = "{url}/public/simple"
[[axes.cuda]]
version = "12.8"
[targets.box]
arch = ["sm_90"]
gpus = 2
[perf]
concurrency = [1]
trials = 2
output-len = 48
warmup = 1
requests = 4
[perf.servers.baseline]
argv = ["python", "-c", "{server}", "--port", "{{port}}", "--tok-s", "300"]
startup-timeout = 60
[perf.servers.eagle3]
argv = ["python", "-c", "{server}", "--port", "{{port}}", "--tok-s", "900", "--accept-length", "3"]
startup-timeout = 60
[thresholds.perf]
min-speedup = 1.5
min-accept-length = 2.0
max-spread = 0.5
"""


@pytest.mark.slow
@pytest.mark.skipif(not CPU_TORCH, reason="needs the CPU torch 2.13.0 wheel for Python 3.11 in /opt/wheels")
@pytest.mark.long
def test_gpu8_perf_adds_nccl_and_perf_to_the_cells_of_a_run(tmp_path: Path, index_url: str) -> None:
    text = MATRIX.format(url=index_url, server=SERVER.format(src=str(ROOT / "tests")))
    first = nox(tmp_path, text, "-s", "matrix", run_id="g1", timeout=1200)
    assert first.returncode == 0, first.stdout + first.stderr
    # A later invocation without COMPATLAB_RUN_ID adds to the latest run of this matrix, reusing its venv.
    second = nox(tmp_path, text, "-s", "gpu8_perf", run_id="", timeout=1200)
    assert second.returncode == 0, second.stdout + second.stderr
    (cell,) = json.loads((tmp_path / "reports" / "latest" / "results.json").read_text())["cells"]
    stages = {s["name"]: s for s in cell["stages"]}
    assert list(stages) == ["install", "pins", "static", "import", "cuda", "serve", "nccl", "perf"]
    assert (stages["serve"]["state"], stages["serve"]["required"]) == ("skip", False)
    assert stages["serve"]["reason"] == "skipped: the cell has no SGLang to serve with"
    assert stages["nccl"]["state"] == "skip"
    assert stages["nccl"]["reason"].startswith("no GPU: nccl backend skipped, gloo ran")
    assert stages["nccl"]["details"]["backend"] == "gloo"
    assert stages["perf"]["state"] == "pass", stages["perf"]["reason"]
    figures = stages["perf"]["details"]["figures"]
    assert figures["speedup_c1"] > 1.5
    assert 2.0 < figures["accept_length_c1"] <= 3.0
    # No GPU: partial, never green; and the grid shows the perf figures.
    assert cell["state"] == "partial"
    assert "speedup" in (tmp_path / "reports" / "latest" / "index.html").read_text()
