"""The rules of a matrix (``[[rules.<kind>]]``): leave cells out, add one, expect a verdict, force the axis
pins, or keep only the cells near a shipped stack. A rule is a partial assignment (axis -> accepted
versions, by PEP 440 equality) with what it means; every problem of ``[rules]`` is reported at once.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from compatlab.config.axes import RULE_META_KEYS, Axis, same_version
from compatlab.config.check import Checker, show

__all__ = ["Rule", "RuleKind", "parse_rules"]


class RuleKind(StrEnum):
    """What a ``[[rules.<kind>]]`` does: leave cells out, add one, expect a verdict, install with the axis
    pins forced, or keep only the cells near a shipped stack."""

    EXCLUDE = "exclude"
    INCLUDE = "include"
    EXPECT = "expect"
    FORCE = "force"
    NEIGHBOURS = "neighbours"


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Rule:
    """A partial assignment (axis -> accepted versions) with what it means."""

    kind: RuleKind
    match: Mapping[str, tuple[str, ...]]
    reason: str = ""
    expect: str | None = None  # "fail" for a known-bad combination
    distance: int = 1  # neighbours: how many package axes away from a shipped stack a cell may be

    def matches(self, assignment: Mapping[str, str]) -> bool:
        for axis, versions in self.match.items():
            got = assignment.get(axis)
            if got is None or not any(same_version(got, v) for v in versions):
                return False
        return True


_NEIGHBOURS_KEYS = frozenset({"of", "distance", "reason"})


def _parse_neighbours(ck: Checker, entries: object) -> list[Rule]:
    """``[[rules.neighbours]] of = "shipped"``: only cells near a shipped stack of the lock run."""
    if not isinstance(entries, list):
        ck.error("rules.neighbours", f"expected an array of tables ([[rules.neighbours]]), got {show(entries)}")
        return []
    rules = []
    for i, entry in enumerate(entries):
        where = f"rules.neighbours[{i}]"
        if not isinstance(entry, dict):
            ck.error(where, f"expected a table, got {show(entry)}")
            continue
        ck.keys(entry, where, _NEIGHBOURS_KEYS)
        if entry.get("of") != "shipped":
            ck.error(
                f"{where}.of",
                f'expected "shipped" (the stacks the lock\'s releases pin), got '
                f"{show(entry.get('of')) if 'of' in entry else 'nothing'}",
            )
        distance = ck.number(
            entry,
            where,
            "distance",
            integer=True,
            strict=False,
            expected="a non-negative integer",
            limit="rules.neighbours.distance",
        )
        reason = ck.string(entry, where, "reason") or ""
        rules.append(
            Rule(kind=RuleKind.NEIGHBOURS, match={}, reason=reason, distance=1 if distance is None else int(distance))
        )
    return rules


def parse_rules(
    ck: Checker, data: Mapping[str, Any], axes: list[Axis], broken: set[str], notes: list[str]
) -> list[Rule]:
    raw_rules = ck.table(data, "", "rules")
    ck.keys(raw_rules, "rules", {k.value for k in RuleKind})
    by_name = {a.name: a for a in axes}
    rules: list[Rule] = []
    for kind in (RuleKind.EXCLUDE, RuleKind.INCLUDE, RuleKind.EXPECT, RuleKind.FORCE):
        entries = raw_rules.get(kind, [])
        if not isinstance(entries, list):
            ck.error(f"rules.{kind}", f"expected an array of tables ([[rules.{kind}]]), got {show(entries)}")
            continue
        for i, entry in enumerate(entries):
            where = f"rules.{kind}[{i}]"
            if not isinstance(entry, dict):
                ck.error(where, f"expected a table, got {show(entry)}")
                continue
            match: dict[str, tuple[str, ...]] = {}
            for key, raw in entry.items():
                if key in RULE_META_KEYS:
                    continue
                sub = f"{where}.{key}"
                if key not in by_name and key in broken:
                    continue  # an axis with a problem of its own (misspelled in [axes]): said there
                if key not in by_name:
                    close = difflib.get_close_matches(key, sorted(set(by_name) | RULE_META_KEYS), n=1)
                    hint = f"; perhaps you meant {close[0]!r}?" if close else ""
                    ck.error(sub, f"not an axis and not 'reason' or 'expect'{hint}")
                    continue
                if raw == []:
                    ck.error(sub, "an empty list names no version; give at least one, or remove the key")
                    continue
                if kind == RuleKind.INCLUDE and isinstance(raw, list) and len(raw) > 1:
                    ck.error(
                        sub,
                        f"an included cell has one version per axis, got {len(raw)}; "
                        "write one [[rules.include]] per cell",
                    )
                    continue
                versions = raw if isinstance(raw, list) else [raw]
                ok = []
                for j, version in enumerate(versions):
                    at = f"{sub}[{j}]" if isinstance(raw, list) else sub
                    if not isinstance(version, str):
                        ck.error(at, f"expected a version string, got {show(version)}")
                    elif ck.text(version, at) is None or key in broken:
                        continue
                    elif by_name[key].find(version) is None and by_name[key].select is not None:
                        # A selecting axis follows its index: a rule may name a version not chosen now.
                        if ck.version(version, at) is not None:
                            notes.append(
                                f"{at}: {key} {version} is not among the versions selected now "
                                f"({', '.join(v.version for v in by_name[key].values) or 'none'}); "
                                "this rule matches no cell"
                            )
                            ok.append(version)
                    elif by_name[key].find(version) is None:
                        known = ", ".join(v.version for v in by_name[key].values)
                        ck.error(at, f"{version!r} is not a value of axis {key!r} ({known})")
                    else:
                        ok.append(version)
                if ok:
                    match[key] = tuple(ok)
            reason = ck.string(entry, where, "reason", required=kind in (RuleKind.EXCLUDE, RuleKind.EXPECT)) or ""
            expect = None
            if "expect" in entry:
                if kind == RuleKind.FORCE:
                    ck.error(f"{where}.expect", "a force rule says how cells install; put expect in [[rules.expect]]")
                elif kind == RuleKind.EXCLUDE:
                    ck.error(f"{where}.expect", "an excluded cell does not run; move this rule to [[rules.expect]]")
                elif entry["expect"] != "fail":
                    ck.error(f"{where}.expect", f'the only expectation is "fail", got {show(entry["expect"])}')
                else:
                    expect = "fail"
                    if not reason and kind == RuleKind.INCLUDE:
                        ck.error(f"{where}.reason", "missing; a known-bad combination needs a reason")
            elif kind == RuleKind.EXPECT:
                ck.error(f"{where}.expect", 'missing; write expect = "fail"')
            if kind == RuleKind.INCLUDE:
                missing = [a.name for a in axes if a.name not in entry and a.name not in broken]
                if missing:
                    ck.error(where, "an included cell names a value for every axis; missing " + ", ".join(missing))
            elif not any(k for k in entry if k not in RULE_META_KEYS):
                ck.error(where, "names no axis, so it would match every cell")
            if kind == RuleKind.INCLUDE and any(by_name[a].find(v[0]) is None for a, v in match.items()):
                continue  # it names a version its selecting axis does not have now (noted above)
            rules.append(Rule(kind=kind, match=match, reason=reason, expect=expect))
    if "neighbours" in raw_rules:
        rules.extend(_parse_neighbours(ck, raw_rules["neighbours"]))
    return rules
