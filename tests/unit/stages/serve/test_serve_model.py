"""Shrinking real model configs for --load-format dummy: depth only, every width kept.

The configs are written from the published config.json fields of Meta-Llama-3.1-8B-Instruct,
DeepSeek-V3, Kimi-K2-Instruct and Kimi-K2.5 (no download): what a box owner would point [serve] at.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from compatlab.stages.serve.model import (
    SetupError,
    aux_layer_ids,
    draft_config,
    make_model,
    shrink,
    tokenizer_json,
)

LLAMA_31_8B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009],
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 128256,
}
DEEPSEEK_V3: dict[str, Any] = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "bos_token_id": 0,
    "eos_token_id": 1,
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 61,
    "num_nextn_predict_layers": 1,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "n_shared_experts": 1,
    "n_routed_experts": 256,
    "routed_scaling_factor": 2.5,
    "kv_lora_rank": 512,
    "q_lora_rank": 1536,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "qk_nope_head_dim": 128,
    "topk_method": "noaux_tc",
    "n_group": 8,
    "topk_group": 4,
    "num_experts_per_tok": 8,
    "moe_layer_freq": 1,
    "first_k_dense_replace": 3,
    "norm_topk_prob": True,
    "scoring_func": "sigmoid",
    "vocab_size": 129280,
    "max_position_embeddings": 163840,
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000,
    "hidden_act": "silu",
    "torch_dtype": "bfloat16",
    "rope_scaling": {
        "beta_fast": 32,
        "beta_slow": 1,
        "factor": 40,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096,
        "type": "yarn",
    },
    "quantization_config": {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "weight_block_size": [128, 128],
    },
}
KIMI_K2: dict[str, Any] = {
    **DEEPSEEK_V3,
    "model_type": "kimi_k2",
    "first_k_dense_replace": 1,
    "n_routed_experts": 384,
    "num_attention_heads": 64,
    "num_key_value_heads": 64,
    "vocab_size": 163840,
    "bos_token_id": 163584,
    "eos_token_id": 163585,
    "routed_scaling_factor": 2.827,
    "rope_theta": 50000.0,
}
KIMI_K25: dict[str, Any] = {
    "architectures": ["KimiK25ForConditionalGeneration"],
    "model_type": "kimi_k25",
    "text_config": KIMI_K2,
    "vision_config": {"hidden_size": 1152, "num_hidden_layers": 27},
    "media_placeholder_token_id": 163605,
}


def _same_but(before: dict[str, Any], after: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    return {k: (before.get(k), after.get(k)) for k in before.keys() | after.keys() if before.get(k) != after.get(k)}


def test_llama_keeps_every_width_and_loses_only_depth() -> None:
    shrunk, notes = shrink(LLAMA_31_8B, 2)
    assert _same_but(LLAMA_31_8B, shrunk) == {"num_hidden_layers": (32, 2)}
    assert notes == ["num_hidden_layers 32 -> 2"]


def test_deepseek_v3_keeps_a_moe_layer_its_experts_mla_and_fp8() -> None:
    shrunk, notes = shrink(DEEPSEEK_V3, 2)
    assert _same_but(DEEPSEEK_V3, shrunk) == {"num_hidden_layers": (61, 2), "first_k_dense_replace": (3, 1)}
    assert notes == ["num_hidden_layers 61 -> 2", "first_k_dense_replace 3 -> 1 (so that a MoE layer remains)"]
    assert shrunk["quantization_config"]["weight_block_size"] == [128, 128]
    four, _ = shrink(DEEPSEEK_V3, 4)  # three dense layers and one MoE layer: nothing else to change
    assert _same_but(DEEPSEEK_V3, four) == {"num_hidden_layers": (61, 4)}


def test_kimi_k2_and_its_one_layer_form() -> None:
    shrunk, notes = shrink(KIMI_K2, 2)
    assert _same_but(KIMI_K2, shrunk) == {"num_hidden_layers": (61, 2)}  # first_k_dense_replace 1 is one dense layer
    one, notes = shrink(KIMI_K2, 1)
    assert _same_but(KIMI_K2, one) == {"num_hidden_layers": (61, 1), "first_k_dense_replace": (1, 0)}
    assert notes == ["num_hidden_layers 61 -> 1", "first_k_dense_replace 1 -> 0 (so that a MoE layer remains)"]


def test_a_multimodal_wrapper_is_shrunk_in_its_text_config() -> None:
    shrunk, notes = shrink(KIMI_K25, 4)
    assert shrunk["vision_config"] == KIMI_K25["vision_config"]
    assert _same_but(KIMI_K2, shrunk["text_config"]) == {"num_hidden_layers": (61, 4)}
    assert notes == ["text_config.num_hidden_layers 61 -> 4"]
    assert KIMI_K25["text_config"]["num_hidden_layers"] == 61  # the source is not changed


def test_per_layer_lists_keep_their_first_entries() -> None:
    config = {**LLAMA_31_8B, "num_hidden_layers": 4, "layer_types": ["sliding", "full", "sliding", "full"]}
    shrunk, notes = shrink(config, 2)
    assert shrunk["layer_types"] == ["sliding", "full"]
    assert notes == ["num_hidden_layers 4 -> 2", "layer_types: first 2 of 4 entries"]


def test_a_file_that_is_not_a_model_config_is_named() -> None:
    with pytest.raises(SetupError) as info:
        shrink({"foo": 1}, 2)
    assert str(info.value) == "config.json has no num_hidden_layers (an integer): is it a model's config?"


def test_drafts_take_the_targets_width_heads_and_vocabulary() -> None:
    draft = draft_config(LLAMA_31_8B)
    assert {
        k: draft[k]
        for k in (
            "architectures",
            "hidden_size",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "vocab_size",
            "draft_vocab_size",
            "num_hidden_layers",
            "eos_token_id",
            "rope_scaling",
        )
    } == {
        "architectures": ["LlamaForCausalLMEagle3"],
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 128256,
        "draft_vocab_size": 128256,
        "num_hidden_layers": 1,
        "eos_token_id": [128001, 128008, 128009],
        "rope_scaling": LLAMA_31_8B["rope_scaling"],
    }
    mla = draft_config(KIMI_K25)  # 7168 / 64 heads = 112: no Llama head shape; 56 heads of 128
    assert (
        mla["hidden_size"],
        mla["num_attention_heads"],
        mla["num_key_value_heads"],
        mla["head_dim"],
        mla["vocab_size"],
    ) == (7168, 56, 8, 128, 163840)


def test_eagle3_captures_three_layers_that_exist() -> None:
    assert aux_layer_ids(4) == [0, 1, 2]
    assert aux_layer_ids(16) == [0, 7, 14]
    for layers in range(4, 64):
        ids = aux_layer_ids(layers)
        assert len(set(ids)) == 3
        assert all(0 <= i <= layers - 2 for i in ids)  # SGLang captures the state entering layer id + 1


def test_the_generated_tokenizer_has_the_vocabulary_and_the_special_ids() -> None:
    tok, settings = tokenizer_json(10, 0, [1, 7])
    assert tok["model"]["vocab"] == {
        "<s>": 0,
        "</s>": 1,
        "<unk>": 2,
        "w3": 3,
        "w4": 4,
        "w5": 5,
        "w6": 6,
        "</s1>": 7,
        "w8": 8,
        "w9": 9,
    }
    assert [(t["id"], t["content"]) for t in tok["added_tokens"]] == [
        (0, "<s>"),
        (1, "</s>"),
        (2, "<unk>"),
        (7, "</s1>"),
    ]
    assert (settings["bos_token"], settings["eos_token"], settings["unk_token"]) == ("<s>", "</s>", "<unk>")
    tok, settings = tokenizer_json(5, None, None)
    assert "bos_token" not in settings
    assert tok["model"]["vocab"]["<unk>"] == 0


def test_make_model_writes_what_sglang_reads(tmp_path: Path) -> None:
    (tmp_path / "dsv3").mkdir()
    (tmp_path / "dsv3" / "config.json").write_text(json.dumps(DEEPSEEK_V3), encoding="utf-8")
    files = make_model(tmp_path / "out", model=tmp_path / "dsv3", layers=2)
    assert (files.architecture, files.layers) == ("DeepseekV3ForCausalLM", 4)
    assert files.notes == (
        "num_hidden_layers 61 -> 4 (EAGLE-3 captures three hidden states: at least 4 layers)",
        "draft: LlamaForCausalLMEagle3, 1 layer(s), derived from the target",
        "draft: eagle_config.eagle_aux_hidden_state_layer_ids [0, 1, 2]",
    )
    target = json.loads((files.target / "config.json").read_text(encoding="utf-8"))
    assert _same_but(DEEPSEEK_V3, target) == {"num_hidden_layers": (61, 4)}
    assert files.draft is not None
    draft = json.loads((files.draft / "config.json").read_text(encoding="utf-8"))
    assert draft["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": [0, 1, 2], "use_aux_hidden_state": True}
    for folder in (files.target, files.draft):
        assert sorted(p.name for p in folder.iterdir()) == [
            "config.json",
            "generation_config.json",
            "tokenizer.json",
            "tokenizer_config.json",
        ]
    vocab = json.loads((files.target / "tokenizer.json").read_text(encoding="utf-8"))["model"]["vocab"]
    assert len(vocab) == 129280
    assert json.loads((files.target / "generation_config.json").read_text()) == {"bos_token_id": 0, "eos_token_id": 1}
    baseline_only = make_model(tmp_path / "b", model=None, layers=2, eagle3=False)
    assert (baseline_only.layers, baseline_only.draft) == (2, None)


def test_a_given_draft_gets_layer_ids_of_the_shrunk_target(tmp_path: Path) -> None:
    real_draft = {**draft_config(LLAMA_31_8B), "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 15, 28]}}
    (tmp_path / "draft.json").write_text(json.dumps(real_draft), encoding="utf-8")
    (tmp_path / "llama.json").write_text(json.dumps(LLAMA_31_8B), encoding="utf-8")
    files = make_model(tmp_path / "out", model=tmp_path / "llama.json", layers=6, draft=tmp_path / "draft.json")
    assert files.draft is not None
    draft = json.loads((files.draft / "config.json").read_text(encoding="utf-8"))
    assert draft["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 2, 4]
    assert files.notes[1:] == ("draft: eagle_config.eagle_aux_hidden_state_layer_ids [0, 2, 4]",)


def test_missing_and_broken_configs_are_named_with_the_key(tmp_path: Path) -> None:
    with pytest.raises(SetupError) as info:
        make_model(tmp_path / "out", model=tmp_path / "nowhere", layers=2)
    assert str(info.value) == (
        f"serve.model: {tmp_path / 'nowhere'} does not exist; give the model's config.json "
        "(a file, never downloaded) or drop the key for the built-in model"
    )
    (tmp_path / "bad.json").write_text("{", encoding="utf-8")
    with pytest.raises(SetupError) as info:
        make_model(tmp_path / "out", model=None, layers=2, draft=tmp_path / "bad.json")
    assert str(info.value).startswith(f"serve.draft: cannot read {tmp_path / 'bad.json'} as JSON: ")
    assert copy.deepcopy(LLAMA_31_8B) == LLAMA_31_8B
