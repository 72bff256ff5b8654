"""The README's quick start as a new user on Debian or Ubuntu reads it: commands that work as written."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _quick_start() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return text[text.index("## Quick start") : text.index("### The `compatlab` command")]


def _commands(section: str) -> list[str]:
    blocks = re.findall(r"```sh\n(.*?)```", section, flags=re.DOTALL)
    return [line.split("  #")[0].strip() for block in blocks for line in block.splitlines() if line.strip()]


def test_tools_are_installed_into_a_venv_never_into_the_system_python() -> None:
    # PEP 668: Debian's python3 refuses `python3 -m pip install` with "externally-managed-environment".
    commands = _commands(_quick_start())
    installs = [i for i, c in enumerate(commands) if "pip install" in c]
    assert installs, commands
    for i in installs:
        before = " && ".join(commands[: i + 1])
        assert "python3 -m pip install" not in commands[i], commands[i]
        assert re.search(r"python3 -m venv (\S+) && \. \1/bin/activate && python -m pip install", before), before
    assert "pipx install nox" in _quick_start()


def test_the_quick_start_says_the_disk_it_needs_and_how_to_move_the_caches() -> None:
    section = _quick_start()
    assert "about 20 GB of uv's cache" in section
    exports = {c.split("=")[0].removeprefix("export ") for c in _commands(section) if c.startswith("export ")}
    assert exports == {"UV_CACHE_DIR", "COMPATLAB_VENVS", "COMPATLAB_CACHE"}


def test_the_readmes_table_of_counts_is_the_labs_table_of_bounds() -> None:
    from compatlab.config.limits import LIMITS

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("### Counts from input") : text.index("## Nightly, and more than one box")]
    rows = re.findall(r"^\| `([^`]+)` \| ([\d,]+) \| (.+) \|$", section, flags=re.MULTILINE)
    assert rows == [(key, f"{limit.maximum:,}", limit.why) for key, limit in LIMITS.items()]
