"""The bound of a count that is read at run time, not at load: the prompts of `[perf] prompts`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from compatlab.config.limits import LIMITS
from compatlab.config.perf import load_prompts
from compatlab.errors import ConfigError


def test_a_prompt_set_past_its_bound_is_one_line_naming_the_file(tmp_path: Path) -> None:
    bound = LIMITS["perf.prompts"].maximum
    path = tmp_path / "prompts.json"
    path.write_text(json.dumps({"prompts": [{"id": str(i), "text": "hi"} for i in range(bound + 1)]}))
    with pytest.raises(ConfigError) as info:
        load_prompts(path)
    assert str(info.value) == (
        f"{path}: prompts: {bound + 1:,} is more than {bound:,}, the most allowed: {LIMITS['perf.prompts'].why}"
    )
    path.write_text(json.dumps({"prompts": [{"id": str(i), "text": "hi"} for i in range(bound)]}))
    assert len(load_prompts(path)) == bound
