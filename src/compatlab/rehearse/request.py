"""The install a rehearsal applies: the arguments of ``uv pip install`` as the box owner would type them.

They stay an argv from start to end (never a shell string): the lab adds ``--python <copy>/bin/python`` in
front and, for the safer command, ``--constraint FILE`` behind. What the lab reads of them: the packages
asked for (requirements, ``-r`` files, ``--upgrade-package``), whether they carry an index of their own, and
the options that would aim the install elsewhere (``--python``, ``--system``, ``--target``, ``--prefix``) or
not install at all (``--dry-run``), which are refused. Where they name no index, the environment's own
``pip.conf`` (pip reads ``<prefix>/pip.conf``; uv does not) gives its index, extra indexes and find-links.
"""

from __future__ import annotations

import configparser
import contextlib
import dataclasses
import re
from collections.abc import Sequence
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from compatlab.errors import UsageError

__all__ = ["Request", "parse_request", "pip_conf_indexes"]

# uv pip install's options that take a value (the next argument, or after "=").
_VALUED = frozenset(
    {
        "-r",
        "--requirement",
        "--requirements",
        "-c",
        "--constraint",
        "--constraints",
        "--override",
        "--overrides",
        "-e",
        "--editable",
        "-i",
        "--index-url",
        "--extra-index-url",
        "--index",
        "--default-index",
        "-f",
        "--find-links",
        "-P",
        "--upgrade-package",
        "--reinstall-package",
        "--no-build-isolation-package",
        "--no-binary",
        "--only-binary",
        "--index-strategy",
        "--keyring-provider",
        "--resolution",
        "--prerelease",
        "--fork-strategy",
        "--exclude-newer",
        "--exclude-newer-package",
        "--link-mode",
        "--config-setting",
        "-C",
        "--config-settings-package",
        "--extra",
        "--group",
        "--python-version",
        "--python-platform",
        "--torch-backend",
        "--cache-dir",
        "--config-file",
        "--color",
        "--directory",
        "--project",
        "--allow-insecure-host",
        "--trusted-host",
        "--build-constraint",
        "--build-constraints",
        "-b",
    }
)
# Short options uv also reads glued to their value: -rFILE, -iURL.
_GLUED = frozenset({"-r", "-c", "-e", "-i", "-f", "-P"})
_INDEX = frozenset({"-i", "--index-url", "--extra-index-url", "--index", "--default-index", "-f", "--find-links"})
_REFUSED = {
    "-p": "the rehearsal installs into its copy of the environment",
    "--python": "the rehearsal installs into its copy of the environment",
    "--system": "the rehearsal installs into its copy of the environment",
    "--target": "the rehearsal installs into its copy of the environment",
    "--prefix": "the rehearsal installs into its copy of the environment",
    "--break-system-packages": "the rehearsal installs into its copy of the environment",
    "--dry-run": "the rehearsal installs for real, into a copy",
}


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Request:
    """The arguments of ``uv pip install`` (after ``--python``), and what the lab read of them."""

    args: tuple[str, ...]
    packages: tuple[str, ...]  # canonical names asked for
    has_index: bool
    upgrade_all: bool  # -U/--upgrade: uv may move every package

    def argv(self, uv: str, python: Path, *, constraints: Path | None = None) -> list[str]:
        """The uv command for the environment of *python*, with *constraints* held where given."""
        extra = ["--constraint", str(constraints)] if constraints is not None else []
        return [uv, "pip", "install", "--python", str(python), *self.args, *extra]


def _names_in_file(path: Path, seen: set[Path]) -> list[str]:
    """The requirement names of a requirements file (and the files it includes with -r); unreadable lines skip."""
    path = path.resolve()
    if path in seen:
        return []
    seen.add(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"{path}: cannot read the requirements file: {exc.strerror or exc}") from None
    names: list[str] = []
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if m := re.match(r"(?:-r|--requirements?)[ =]\s*(\S+)", line):
            names += _names_in_file(path.parent / m.group(1), seen)
            continue
        if line.startswith("-"):
            continue
        try:
            names.append(canonicalize_name(Requirement(line).name))
        except InvalidRequirement:
            continue
    return names


def parse_request(args: Sequence[str], *, requirements: Sequence[Path] = ()) -> Request:
    """Read *args* (and the ``--requirements`` files, passed on as ``-r FILE``); UsageError for what a rehearsal
    cannot do, naming the argument and the fix."""
    full = list(args) + [a for f in requirements for a in ("-r", str(f))]
    if not full:
        raise UsageError(
            "what install? pass the arguments of `uv pip install` after --, e.g. "
            "compatlab rehearse --venv ENV -- -U flashinfer-python, or --requirements FILE"
        )
    packages: list[str] = []
    has_index = False
    upgrade_all = False
    i = 0
    while i < len(full):
        arg = full[i]
        opt, eq, inline = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        if opt in _REFUSED:
            raise UsageError(f"rehearse: {opt}: {_REFUSED[opt]}; drop it from the install's arguments")
        if opt in _VALUED or (len(opt) > 2 and opt[:2] in _GLUED and not eq):
            if opt in _VALUED:
                if eq:
                    value = inline
                else:
                    if i + 1 >= len(full):
                        raise UsageError(f"rehearse: {opt} needs a value (uv pip install {opt} VALUE)")
                    value = full[i + 1]
                    i += 1
            else:  # -rFILE, -ifoo: the short option glued to its value
                opt, value = opt[:2], opt[2:]
            if opt in _INDEX:
                has_index = True
            if opt in ("-r", "--requirement", "--requirements"):
                packages += _names_in_file(Path(value), set())
            elif opt in ("-P", "--upgrade-package"):
                packages.append(canonicalize_name(value))
            elif opt in ("-e", "--editable"):
                egg = re.search(r"#egg=([\w.-]+)", value)
                if egg:
                    packages.append(canonicalize_name(egg.group(1)))
        elif arg in ("-U", "--upgrade"):
            upgrade_all = True
        elif arg.startswith("-"):
            pass  # a flag: --no-deps, --reinstall, -q … are uv's, passed on as given
        else:
            # A path or URL of a wheel is no requirement: uv reads it; the lab cannot name it before uv installed it.
            with contextlib.suppress(InvalidRequirement):
                packages.append(canonicalize_name(Requirement(arg).name))
        i += 1
    return Request(
        args=tuple(full),
        packages=tuple(dict.fromkeys(packages)),
        has_index=has_index,
        upgrade_all=upgrade_all,
    )


def pip_conf_indexes(prefix: Path) -> list[str]:
    """``--index-url``/``--extra-index-url``/``--find-links`` arguments from the environment's own ``pip.conf``
    (``[global]`` then ``[install]``, as pip reads it: the later section wins); [] when it has none."""
    conf = prefix / "pip.conf"
    if not conf.is_file():
        return []
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read(conf, encoding="utf-8")
    except (configparser.Error, UnicodeDecodeError) as exc:
        raise UsageError(f"{conf}: cannot read it as pip reads it: {exc}") from None
    values: dict[str, str] = {}
    for section in ("global", "install"):
        if parser.has_section(section):
            values.update(
                {k: v for k, v in parser.items(section) if k in ("index-url", "extra-index-url", "find-links")}
            )
    out: list[str] = []
    if "index-url" in values:
        out += ["--index-url", values["index-url"].strip()]
    for key in ("extra-index-url", "find-links"):
        for value in values.get(key, "").split():
            out += [f"--{key}", value]
    return out
