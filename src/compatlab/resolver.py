"""What uv says when a cell cannot be installed, told as the cause: the conflict, or the placeholder sdist.

**The conflict.** uv (PubGrub) explains "No solution found when resolving dependencies" as a derivation:
sentences "Because P1 and P2, we can conclude that C." and "And because P3, we can conclude that C'." (an
"And because" also builds on the sentence before it), ending in "... compatlab-cell depends on torch==2.10.0
and flashinfer-python==0.6.1, we can conclude that your requirements are unsatisfiable." ``compatlab-cell``
is the lab's own generated project (envs.install_plan): it is the cell, never a name to show. The facts that
matter are the derivation's leaves (what each package depends on, what is missing), with a derived "X
depends on Y" kept in place of the facts it was derived from (uv's own condensation: "all versions of
cuda-python depend on cuda-bindings>=13.0.3"), and derived "... are incompatible" expanded into their
reasons. ``condense_conflict`` returns those, in uv's order but the facts about the cell's own pins first,
and those named by their versions ("torch 2.10.0 depends on cuda-bindings==12.9.4"). uv's one-item-a-line
lists ("depend on one of:") are folded into their sentence, and environment markers dropped.

**Placeholder sdists.** Some releases on PyPI are an sdist whose build backend (wheel-stub, formerly
nvidia-stub; PEP 517) downloads the real wheel from another index at build time: cuda-tile 1.6.0rc5 (which
sglang 0.5.18-0.5.22 pin) is one. uv reports "Failed to build `cuda-tile==1.6.0rc5`", the backend's
``InstallFailedError`` with its banner ("*****… This is a special placeholder package which downloads a
real wheel package from https://pypi.nvidia.com/. …"), and its hint "`cuda-tile` (v1.6.0rc5) was included
because `sglang` (v0.5.22) depends on `cuda-tile`". On a machine that cannot reach that index the release
cannot be installed from the matrix's indexes: ``placeholder`` names the release, who asked for it and the
index it wants.
"""

from __future__ import annotations

import dataclasses
import re

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion

__all__ = ["LAB_PROJECT", "Placeholder", "condense_conflict", "placeholder"]

LAB_PROJECT = "compatlab-cell"  # the name envs.install_plan gives the generated project
_DEFAULT_STUB_INDEX = "https://pypi.nvidia.com"  # nvidia-stub's NVIDIA_PIP_INDEX_URL default

_ROOT = re.compile(rf"^(?:{re.escape(LAB_PROJECT)}|your project)(?:==\S+)? depends on (.+)$")
# A premise starts where a package (optionally with a specifier) is followed by a verb, or with uv's
# quantifiers: that is where " and " separates two premises rather than two requirements.
_CLAUSE_START = (
    r"(?:all versions of |all of |only |there (?:is|are) |no versions? of |the requested |"
    r"[A-Za-z0-9][A-Za-z0-9._\[\],-]*(?:[<>=!~]=?[^\s,]+(?:,[<>=!~]=?[^\s,]+)*)? "
    r"(?:depends?|was|were|has|have|is|are|cannot|needs?|requires?)\b)"
)
_AND = re.compile(rf" and (?={_CLAUSE_START})")
_STEP = re.compile(r"^(And because|Because) (.+?), we can conclude that (.+?)\.?$")
_DEPENDS = re.compile(r"^(?:all versions of )?([A-Za-z0-9][A-Za-z0-9._-]*)(\S*) depends? on (.+)$")


def _items(items: list[str], word: str) -> str:
    """A list uv prints one item a line ("depend on one of:"), on one line: one name said once."""
    names = {re.split(r"[<>=!~{ ]", i, maxsplit=1)[0] for i in items}
    if len(names) == 1:
        name = names.pop()
        return name + f" {word} ".join(i[len(name) :] for i in items)
    return f" {word} ".join(items)


def _fold(head: str, items: list[str]) -> str:
    """ "… depend on one of:" and its items -> "… depend on A or B"; "… that all of:" -> "… that A and B"."""
    word = "or" if head.endswith(" one of:") else "and"
    stem = head[: -len(" one of:")] if word == "or" else head[: -len(" all of:")]
    return f"{stem} {_items(items, word)}".strip()


def _derivation(text: str) -> list[str]:
    """uv's explanation as sentences: tree markers, line wrapping, environment markers and hints removed, its
    one-item-a-line lists ("all of:", "depend on one of:") folded into their sentence."""
    body: list[str] = []
    pending: tuple[str, list[str]] | None = None  # a line ending in "of:" and its items
    for raw in text.splitlines():
        line = raw.strip().lstrip("×╰─▶│|").strip()
        if pending is not None:
            if (
                line
                and not line.startswith(("And because", "Because"))
                and not line.endswith(" of:")
                and " depend" not in line
            ):
                pending[1].append(line)
                continue
            body.append(_fold(*pending))
            pending = None
        if not line or line.startswith(("hint:", "help:", "Using Python", "warning:")):
            continue
        line = line.removeprefix("error:").removeprefix("cause:").strip()
        if line.startswith("No solution found when resolving"):
            continue
        if line.endswith((" one of:", " all of:")) or line in ("one of:", "all of:"):
            pending = (line, [])
            continue
        body.append(line)
    if pending is not None:
        body.append(_fold(*pending))
    joined = re.sub(r"\{[^}]*\}", "", " ".join(body))  # environment markers: "cuda-bindings{sys_platform …}==12.9.4"
    return [s.strip() for s in re.split(r"\s+(?=(?:And because|Because)\b)", joined) if s.strip()]


def _pins(root: str) -> dict[str, str]:
    out = {}
    for req in re.split(r",? and |, ", root):
        if m := re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s,;]+)", req.strip()):
            out[m.group(1).lower()] = m.group(2)
    return out


def condense_conflict(text: str) -> tuple[str, list[str]] | None:
    """(the cell's requirements that uv names, the conflict's facts) from uv's unsatisfiable output, or None
    when it has no derivation this reads (see the module doc)."""
    steps: list[tuple[list[str | int], str]] = []
    root = ""
    for sentence in _derivation(text):
        m = _STEP.match(sentence)
        if m is None:
            continue
        premises: list[str | int] = [p.strip() for p in _AND.split(m.group(2))]
        if m.group(1) == "And because" and steps:
            premises.insert(0, len(steps) - 1)
        for i, p in enumerate(premises):
            if isinstance(p, str):
                if r := _ROOT.match(p):
                    root = r.group(1)
                    premises[i] = -1
                else:  # uv restates an earlier conclusion as a premise: the same step
                    premises[i] = next((j for j, (_, c) in enumerate(steps) if c == p), p)
        steps.append((premises, m.group(3).strip()))
    if not steps:
        return None
    pins = _pins(root)
    facts: list[str] = []

    def expand(index: int, depth: int = 0) -> None:
        for p in steps[index][0]:
            if p == -1:
                continue
            if isinstance(p, int):
                conclusion = steps[p][1]
                if _DEPENDS.match(conclusion) or depth > 32:
                    _add(conclusion)
                else:
                    expand(p, depth + 1)
            else:
                _add(p)

    own: set[str] = set()  # the facts about the cell's own pins: said first

    def _add(fact: str) -> None:
        mine = False
        if m := _DEPENDS.match(fact):
            name, spec, wants = m.groups()
            pinned = pins.get(name.lower())
            mine = bool(pinned and _within(pinned, spec))
            fact = f"{name} {pinned} depends on {wants}" if mine else f"{name}{spec} depends on {wants}"
        fact = fact.replace(f"{LAB_PROJECT} ", "the cell ")
        if fact not in facts:
            facts.append(fact)
            if mine:
                own.add(fact)

    expand(len(steps) - 1)
    return root, sorted(facts, key=lambda f: f not in own)


def _within(version: str, spec: str) -> bool:
    """Whether uv's range (``<=0.6.1``, ``>=13.1.0,<13.2.dev0``, none) holds the cell's pin."""
    try:
        return SpecifierSet(spec).contains(version, prereleases=True)
    except (InvalidSpecifier, InvalidVersion):
        return False


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Placeholder:
    package: str
    version: str
    index: str  # where its build downloads the real wheel from
    wanted_by: str = ""  # "sglang 0.5.22", from uv's hint, where it gives one

    def describe(self) -> str:
        who = f" (which {self.wanted_by} requires)" if self.wanted_by else ""
        return (
            f"{self.package} {self.version}{who} is a placeholder sdist: building it downloads the real wheel "
            f"from {self.index}, which failed here; give {self.package} that index, or pin a release of it "
            "that has wheels"
        )


def placeholder(text: str) -> Placeholder | None:
    """The release uv failed to build, when its build backend is a placeholder that downloads from another
    index (see the module doc); None otherwise."""
    m = re.search(r"Failed to build `?([A-Za-z0-9][A-Za-z0-9._-]*)(?:==|@| )v?([^`\s]+?)`?(?:\s|$)", text)
    if m is None:
        return None
    said = re.search(r"placeholder package which downloads a real wheel package\s+from\s+(https?://[^\s]+)", text)
    if said is None and not re.search(r"(?:nvidia|wheel)[_-]stub", text):
        return None
    index = said.group(1).rstrip(".,;").rstrip("/") if said else _DEFAULT_STUB_INDEX
    why = re.search(rf"`{re.escape(m.group(1))}` \(v[^)]+\) was included because `([^`]+)` \(v([^)]+)\)", text)
    return Placeholder(
        package=m.group(1), version=m.group(2), index=index, wanted_by=f"{why.group(1)} {why.group(2)}" if why else ""
    )
