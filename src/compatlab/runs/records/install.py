"""The install stage's details: the command it ran (``argv``: uv's, or ``uv venv``'s where the venv could not be
made), the tails of its output, uv's own seconds and how many attempts it took (only an error is retried).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from compatlab.runs.model import StageResult
from compatlab.runs.records.common import number, text, texts

__all__ = ["InstallDetails"]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class InstallDetails:
    """``stdout`` and ``uv_seconds`` are None where the venv could not be made (nothing was installed);
    ``attempts`` None until the stage's retry loop has counted them."""

    argv: tuple[str, ...] = ()
    stdout: str | None = None
    stderr: str = ""
    uv_seconds: float | None = None
    attempts: int | None = None

    @classmethod
    def of(cls, result: StageResult) -> InstallDetails:
        d = result.details
        attempts = d.get("attempts")
        return cls(
            argv=texts(d.get("argv")),
            stdout=text(d.get("stdout")),
            stderr=text(d.get("stderr")) or "",
            uv_seconds=number(d.get("uv_seconds")),
            attempts=attempts if isinstance(attempts, int) and not isinstance(attempts, bool) else None,
        )

    def to_details(self) -> dict[str, Any]:
        out: dict[str, Any] = {"argv": list(self.argv)}
        if self.stdout is not None:
            out["stdout"] = self.stdout
        out["stderr"] = self.stderr
        if self.uv_seconds is not None:
            out["uv_seconds"] = self.uv_seconds
        if self.attempts is not None:
            out["attempts"] = self.attempts
        return out
