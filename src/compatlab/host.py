"""The machine a run runs on, as run.json records it: host, platform, CPUs, GPUs and driver, uv."""

from __future__ import annotations

import os
import platform
import shutil
import socket
import sys
from typing import Any

from compatlab.proc import run

__all__ = ["host_facts"]


def host_facts() -> dict[str, Any]:
    """The machine a run ran on, for the report: host, platform, CPUs, GPUs and driver, uv."""
    facts: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "gpus": [],
        "driver": None,
    }
    smi = shutil.which("nvidia-smi")
    if smi:
        done = run([smi, "--query-gpu=name,driver_version,compute_cap", "--format=csv,noheader"], timeout=30)
        if done.ok:
            rows = [[c.strip() for c in line.split(",")] for line in done.stdout.strip().splitlines()]
            facts["gpus"] = [{"name": r[0], "compute_cap": r[2] if len(r) > 2 else None} for r in rows if r]
            facts["driver"] = rows[0][1] if rows and len(rows[0]) > 1 else None
    uv = shutil.which("uv")
    if uv:
        done = run([uv, "--version"], timeout=30)
        facts["uv"] = done.stdout.strip()
    return facts
