"""`compatlab check --threshold KEY=SECONDS`: the items read, a bad one named with the fix."""

from __future__ import annotations

import pytest

from compatlab.config.thresholds import parse_threshold_args, suite_thresholds
from compatlab.errors import ConfigError, UsageError


def test_items_become_the_suites_limits() -> None:
    raw = parse_threshold_args(["jit-timeout=600", " import-timeout = 90.5"])
    assert raw == {"jit-timeout": 600.0, "import-timeout": 90.5}
    limits = suite_thresholds(raw, source="--threshold")
    assert (limits.jit_timeout, limits.import_timeout) == (600.0, 90.5)


@pytest.mark.parametrize("item", ["jit-timeout", "jit-timeout=soon", "=600"])
def test_an_item_that_is_not_key_equals_seconds_is_refused(item: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_threshold_args([item])
    assert str(info.value) == f"--threshold {item!r}: expected KEY=SECONDS, e.g. jit-timeout=600"


def test_an_unknown_key_is_named_by_the_flag() -> None:
    with pytest.raises(ConfigError) as info:
        suite_thresholds(parse_threshold_args(["jit-timout=600"]), source="--threshold")  # spellchecker:disable-line
    wanted = "--threshold: jit-timout: unknown key; perhaps you meant 'jit-timeout'?"  # spellchecker:disable-line
    assert str(info.value) == wanted
