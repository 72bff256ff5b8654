"""The static stage's report: all findings of one site-packages directory, its state and one-line reason, its
record (``runs.records.static.StaticDetails``, what a stage result's details hold) and its lines for a terminal.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from compatlab.runs.model import StageState
from compatlab.runs.records.static import Finding, NotNeeded, Severity, StaticDetails

__all__ = ["StaticReport", "format_report"]


@dataclasses.dataclass(kw_only=True, slots=True)
class StaticReport:
    """All findings of one site-packages directory, most important failure first."""

    site_packages: str
    archs: list[str]
    findings: list[Finding]
    modules: int
    seconds: float
    cache_hits: int
    cache_misses: int
    # Modules that cannot load but that `import <package>` does not need: rel path -> package, why, feature.
    not_needed: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)

    def of(self, severity: Severity) -> list[Finding]:
        return [f for f in self.findings if f.severity == severity]

    @property
    def state(self) -> StageState:
        if self.of(Severity.FAIL):
            return StageState.FAIL
        return StageState.WARN if self.of(Severity.WARN) else StageState.PASS

    @property
    def reason(self) -> str:
        """One line: the most important failure (else warning) plus how many more there are."""
        for severity in (Severity.FAIL, Severity.WARN):
            found = self.of(severity)
            if found:
                more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
                return found[0].message + more
        return ""

    def counts(self) -> dict[str, int]:
        return {s.value: len(self.of(s)) for s in Severity}

    def record(self, modules_by_dist: dict[str, list[str]] | None = None) -> StaticDetails:
        """The report as a stage result's details hold it; *modules_by_dist* for a cell's declared packages."""
        return StaticDetails(
            site_packages=self.site_packages,
            archs=tuple(self.archs),
            state=self.state,
            counts=self.counts(),
            modules=self.modules,
            seconds=round(self.seconds, 3),
            cache_hits=self.cache_hits,
            cache_misses=self.cache_misses,
            findings=tuple(self.findings),
            not_needed={rel: NotNeeded.from_json(n) for rel, n in self.not_needed.items()},
            modules_by_dist=None if modules_by_dist is None else {k: tuple(v) for k, v in modules_by_dist.items()},
        )

    def to_json(self) -> dict[str, object]:
        """``compatlab static --json``: the record, without the per-package table."""
        return self.record().to_details()


def format_report(report: StaticReport, verbose: bool) -> Iterator[str]:
    """The report as lines for a terminal: a summary, then findings (notes with *verbose*)."""
    counts = report.counts()
    yield (
        f"static: {report.site_packages}: {report.state} ({counts['fail']} failures, "
        f"{counts['warn']} warnings, {counts['note']} notes; {report.modules} modules in "
        f"{report.seconds:.1f} s, "
        f"cache {report.cache_hits} hits/{report.cache_misses} misses)"
    )
    shown: dict[tuple[str, str, str], int] = {}
    for f in report.findings:
        if f.severity == Severity.NOTE and not verbose:
            continue
        key = (f.severity, f.module, f.kind)
        shown[key] = shown.get(key, 0) + 1
        if shown[key] <= 10 or verbose:
            yield f"{f.severity}: {f.message}"
        elif shown[key] == 11:
            more = sum(1 for g in report.findings if (g.severity, g.module, g.kind) == key) - 10
            yield f"{f.severity}: … and {more} more {f.kind} findings for {f.module} (--json or -v lists all)"
