"""What an install changed, read from two environments and the stage results ``check`` gave each.

- the distributions: every one whose version differs, with its build variant (the version's local label:
  ``+cu130`` against a generic build), the CUDA it belongs to (torch's from the pins stage's ``torch_cuda``,
  a CUDA package's major from its ``cuda_packages``), and who asks for it after the install;
- the pins it breaks: the pins stage's ``broken_requirements`` after the install that were not broken before;
- the verdict of each module: the import stage's entries (what a real process did), else the static stage's
  prediction (its failures by module); a module that worked and fails after is a break, with its cause in
  the stages' own words (the import's failure, and static's finding on the same file where it has one).
"""

from __future__ import annotations

from collections.abc import Mapping

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from compatlab.existing import Environment
from compatlab.runs.model import CellResult
from compatlab.runs.records.pins import PinsDetails
from compatlab.runs.records.static import Severity, StaticDetails
from compatlab.runs.records.suite import SuiteDetails
from compatlab.runs.rehearsal import Change, ModuleChange, ModuleState
from compatlab.site import dists_by_name

__all__ = ["ModuleVerdict", "broken_pins", "changes", "diff_modules", "module_verdicts"]

# module label -> (state, distribution, why it is not green, cause code)
ModuleVerdict = tuple[ModuleState, str, str, str]


def module_verdicts(result: CellResult) -> dict[str, ModuleVerdict]:
    """Each module's verdict in *result*: static's modules and failures first, the import stage's proof over them."""
    out: dict[str, ModuleVerdict] = {}
    static = result.stage("static")
    if static is not None:
        record = StaticDetails.of(static)
        for dist, modules in (record.modules_by_dist or {}).items():
            for module in modules:
                out[module] = (ModuleState.PASS, dist, "", "")
        for f in record.findings:
            if f.severity == Severity.FAIL and f.module:
                out[f.module] = (ModuleState.FAIL, f.dist, f"static: {f.message}", "")
    imported = result.stage("import")
    if imported is not None:
        for entry in SuiteDetails.of(imported).entries():
            if entry.ok:
                state = ModuleState.PASS
            elif entry.needed is False or (entry.failure or {}).get("kind") == "missing-dependency":
                state = ModuleState.WARN
            else:
                state = ModuleState.FAIL
            why = entry.verdict or entry.reason or ""
            out[entry.module] = (state, entry.dist, why, entry.cause or "")
    return out


def _static_words(result: CellResult, module: str) -> str:
    """Static's message of its first failure on *module*; "" for none."""
    static = result.stage("static")
    findings = StaticDetails.of(static).findings if static is not None else ()
    return next((f.message for f in findings if f.severity == Severity.FAIL and f.module == module), "")


def _cause(module: str, proof: str, static: str) -> str:
    """The import's words for *module* without its label, and static's reading of the same file where it adds
    one: ``undefined symbol f(int); torch 2.10.0 (libc10_cuda.so) exports f(unsigned int): … another torch.``"""
    cause = proof.removeprefix(f"{module}: ")
    needs = f"{module} needs "
    if static.startswith(needs) and "; " in static:
        static = static.partition("; ")[2]  # the symbol is in the import's words: keep the near miss
    elif static.startswith("static: ") or static in cause:
        static = ""
    if not cause:
        return f"static: {static}" if static else ""
    return f"{cause}; {static}" if static else cause


def diff_modules(
    before: CellResult, after: CellResult
) -> tuple[list[ModuleChange], list[ModuleChange], list[ModuleChange], list[ModuleChange]]:
    """(breaks, fixes, new and broken, gone): the modules whose verdict the install changed."""
    old, new = module_verdicts(before), module_verdicts(after)
    breaks: list[ModuleChange] = []
    fixes: list[ModuleChange] = []
    new_broken: list[ModuleChange] = []
    gone: list[ModuleChange] = []
    for module in sorted(set(old) | set(new)):
        was = old.get(module, (ModuleState.ABSENT, "", "", ""))
        now = new.get(module, (ModuleState.ABSENT, "", "", ""))
        dist = now[1] or was[1]
        if was[0].works and now[0] == ModuleState.FAIL:
            cause = _cause(module, now[2], _static_words(after, module))
            breaks.append(ModuleChange(module=module, dist=dist, before=was[0], after=now[0], cause=cause, code=now[3]))
        elif was[0] == ModuleState.FAIL and now[0].works:
            fixes.append(ModuleChange(module=module, dist=dist, before=was[0], after=now[0], cause=was[2], code=was[3]))
        elif was[0] == ModuleState.ABSENT and now[0] == ModuleState.FAIL:
            new_broken.append(
                ModuleChange(module=module, dist=dist, before=was[0], after=now[0], cause=now[2], code=now[3])
            )
        elif was[0].works and now[0] == ModuleState.ABSENT:
            gone.append(ModuleChange(module=module, dist=dist, before=was[0], after=now[0]))
    return breaks, fixes, new_broken, gone


def broken_pins(before: CellResult, after: CellResult) -> list[str]:
    """The requirements of installed distributions the result breaks that were met before (the pins stage's words)."""

    def texts(result: CellResult) -> list[str]:
        pins = result.stage("pins")
        return [b.text for b in PinsDetails.of(pins).broken_requirements] if pins else []

    was = set(texts(before))
    return [t for t in texts(after) if t not in was]


def _cuda(result: CellResult) -> tuple[str, dict[str, str]]:
    """(torch's CUDA, {canonical name: CUDA major} of the CUDA packages) from the pins stage's details."""
    pins = result.stage("pins")
    if pins is None:
        return "", {}
    found = PinsDetails.of(pins)
    majors = {
        str(canonicalize_name(entry.split("==", 1)[0])): str(major)
        for major, entries in (found.cuda_packages or {}).items()
        for entry in entries
    }
    return found.torch_cuda or "", majors


def _cuda_of(name: str, version: str, torch_cuda: str, majors: Mapping[str, str]) -> str:
    if not version:
        return ""
    return torch_cuda if name == "torch" else majors.get(name, "")


def _asked_by(env: Environment) -> dict[str, list[str]]:
    """canonical name -> "who 1.0 requires name>=2" for every requirement (without an extra) that names it."""
    out: dict[str, list[str]] = {}
    for dist in dists_by_name(env.site).values():
        for raw in dist.requires:
            try:
                req = Requirement(raw)
            except InvalidRequirement:
                continue
            try:
                if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                    continue
            except Exception:  # noqa: BLE001, S112 - a marker that cannot be evaluated names nobody
                continue
            out.setdefault(canonicalize_name(req.name), []).append(f"{dist.name} {dist.version} requires {req}")
    return out


def changes(
    before: Environment, after: Environment, before_result: CellResult, after_result: CellResult
) -> list[Change]:
    """Every distribution whose version the install changed, added or removed, torch first, then by name."""
    old = {canonicalize_name(n): (n, v) for n, v in before.dists.items()}
    new = {canonicalize_name(n): (n, v) for n, v in after.dists.items()}
    old_torch, old_majors = _cuda(before_result)
    new_torch, new_majors = _cuda(after_result)
    asked = _asked_by(after)
    out: list[Change] = []
    for name in sorted(set(old) | set(new), key=lambda n: (n != "torch", n)):
        was, now = old.get(name, ("", "")), new.get(name, ("", ""))
        if was[1] == now[1]:
            continue

        out.append(
            Change(
                name=now[0] or was[0],
                old=was[1],
                new=now[1],
                old_cuda=_cuda_of(name, was[1], old_torch, old_majors),
                new_cuda=_cuda_of(name, now[1], new_torch, new_majors),
                asked_by=tuple(asked.get(name, ())) if now[1] else (),
            )
        )
    return out
