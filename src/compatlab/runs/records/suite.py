"""The details of a stage that runs a compat suite in the cell (import, cuda: ``stages/suite.py``).

The suite's own JSON is merged into them (each test's details, first writer wins), so ``raw`` keeps every key
in the order the suite wrote it; what the lab reads is typed: the tests, the import stage's ``modules`` (each an
``ImportEntry``, incell/entries.py), how many loaded of how many, the warnings and failures, the cause code of the
first failure and every failure's (``causes``: {"cause", "reason"}), and what the lab adds after the suite: the
``log``, the libraries a package's import loaded by path (``runtime.judge_loaded_by_path``) and the broken pins a
failure names (``runtime.blame_broken_pins``). ``to_details`` writes ``raw`` with the typed values in their
places; a key the suite did not write is added in the order the lab adds it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from compatlab.incell.entries import ImportEntry
from compatlab.runs.model import StageResult
from compatlab.runs.records.common import table, tables, text, texts

__all__ = ["SuiteDetails"]


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class SuiteDetails:
    """None: the key is not there. ``modules`` is read on demand (``entries``): an entry the suite did not
    write is refused there (EntryError), not where only the warnings are read."""

    raw: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    tests: tuple[dict[str, Any], ...] | None = None
    loaded: int | None = None
    total: int | None = None
    cause: str | None = None
    causes: tuple[dict[str, Any], ...] | None = None
    log: str | None = None
    loaded_by_path: Mapping[str, str] | None = None
    tried_by_path: Mapping[str, str] | None = None
    loaded_by_path_findings: tuple[dict[str, Any], ...] | None = None
    failures: tuple[str, ...] | None = None
    warnings: tuple[str, ...] | None = None
    broken_pins: tuple[str, ...] | None = None

    @classmethod
    def of(cls, result: StageResult) -> SuiteDetails:
        return cls.from_details(result.details)

    @classmethod
    def from_details(cls, details: Mapping[str, Any]) -> SuiteDetails:
        d = details

        def listed(key: str) -> tuple[str, ...] | None:
            return texts(d[key]) if key in d else None

        def rows(key: str) -> tuple[dict[str, Any], ...] | None:
            return tables(d[key]) if key in d else None

        def names(key: str) -> dict[str, str] | None:
            return {k: str(v) for k, v in table(d[key]).items()} if key in d else None

        return cls(
            raw=dict(d),
            tests=rows("tests"),
            loaded=_count(d.get("loaded")),
            total=_count(d.get("total")),
            cause=text(d.get("cause")),
            causes=rows("causes"),
            log=text(d.get("log")),
            loaded_by_path=names("loaded_by_path"),
            tried_by_path=names("tried_by_path"),
            loaded_by_path_findings=rows("loaded_by_path_findings"),
            failures=listed("failures"),
            warnings=listed("warnings"),
            broken_pins=listed("broken_pins"),
        )

    def entries(self) -> list[ImportEntry]:
        """The import stage's ``modules``, read back; EntryError on one the suite did not write."""
        modules = self.raw.get("modules")
        return [ImportEntry.from_json(m) for m in modules] if isinstance(modules, list) else []

    def to_details(self) -> dict[str, Any]:
        out = dict(self.raw)
        for field in dataclasses.fields(self):
            value: Any = getattr(self, field.name)
            if field.name == "raw" or value is None:
                continue
            if isinstance(value, tuple):
                value = list(value)
            elif isinstance(value, Mapping):
                value = dict(value)
            out[field.name] = value
        return out
