"""context.json: one class on both sides (the lab writes it, the suites read it); a shape it did not write is an
error that names the key, never a default."""

from __future__ import annotations

import json

import pytest

from compatlab.incell.context import ContextError, PreviousStage, SuiteContext, TargetInfo

CONTEXT = SuiteContext(
    cell="torch2.9.1-cuda13.0",
    axes={"torch": "2.9.1", "cuda": "13.0"},
    cuda="13.0",
    packages={"torch": "2.9.1", "sglang-kernel": "0.4.10"},
    site_packages="/venv/lib/python3.12/site-packages",
    venv="/venv",
    work_dir="/work",
    keep="/venvs/.import-order",
    archs=("sm_90",),
    targets=(
        TargetInfo(
            name="h200",
            gpu="H200",
            arch=("sm_90",),
            gpus=8,
            min_driver="580.65",
            nccl_env={"NCCL_NVLS_ENABLE": "0"},
            not_needed=("*/sm100/*",),
        ),
    ),
    thresholds={"import-timeout": 180.0, "jit-timeout": 900.0},
    previous={"static": PreviousStage(state="warn", reason="x.so: a note")},
)


def test_the_context_survives_json_both_ways() -> None:
    text = json.dumps(CONTEXT.to_json())
    assert SuiteContext.from_json(json.loads(text)) == CONTEXT
    assert CONTEXT.threshold("jit-timeout", 60) == 900.0
    assert CONTEXT.threshold("cuda-op-timeout", 180) == 180.0


def test_a_misspelt_key_is_an_error_naming_it() -> None:
    data = CONTEXT.to_json()
    data["work-dir"] = data.pop("work_dir")
    with pytest.raises(ContextError) as info:
        SuiteContext.from_json(data)
    assert str(info.value) == "context: unknown keys ['work-dir'], missing keys ['work_dir']"
    data = CONTEXT.to_json()
    data["targets"][0]["arch"] = "sm_90"
    with pytest.raises(ContextError, match=r"^context\.targets\[0\]\.arch: expected a list of strings, got 'sm_90'$"):
        SuiteContext.from_json(data)
