"""A model for ``--load-format dummy``: the target's architecture, shrunk in depth only, and a tokenizer.

SGLang's dummy loader makes random weights from ``config.json`` alone, so no weights are downloaded. What
is kept from the real config is what picks and shapes the kernels: ``architectures``, ``hidden_size``,
head counts and dims (MLA's ``kv_lora_rank``, ``q_lora_rank``, ``qk_rope_head_dim`` …), ``vocab_size``,
``intermediate_size``, the experts (``n_routed_experts``, ``num_experts_per_tok``,
``moe_intermediate_size``, shared experts) and ``quantization_config``. Only the depth changes:

- ``num_hidden_layers`` becomes ``layers`` (default 2).
- DeepSeek-V3 and Kimi-K2 make their first ``first_k_dense_replace`` layers dense (3 and 1): kept at most
  ``layers - 1``, so at least one MoE layer runs; Qwen-style ``max_window_layers`` is capped the same way.
- Lists with one entry per layer (``layer_types``) keep their first ``layers`` entries.
- A multimodal wrapper's ``text_config`` (Kimi-K2.5) is shrunk in place; the vision tower is untouched.

With EAGLE-3 the target keeps at least 4 layers, and the draft's
``eagle_config.eagle_aux_hidden_state_layer_ids`` names three of them (see ``aux_layer_ids``).
The EAGLE-3 draft, unless given, is one ``LlamaForCausalLMEagle3`` layer at the target's hidden size,
head counts (MLA targets: 128-wide heads, 8 KV heads) and vocabulary (``draft_vocab_size`` =
``vocab_size``: no hot-token map to load). The tokenizer, unless given, is a word-level
``tokenizer.json`` of exactly ``vocab_size`` tokens with the config's BOS/EOS ids as special tokens,
written here without the ``tokenizers`` package.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

from compatlab.errors import LabError

__all__ = ["BUILTIN", "ModelFiles", "SetupError", "draft_config", "make_model", "shrink", "tokenizer_json"]

# The built-in target: a small Llama (as SGLang's own tests use), served when matrix.toml has no [serve].
BUILTIN: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 1024,
    "intermediate_size": 2816,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "head_dim": 64,
    "num_hidden_layers": 16,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": 1,
    "eos_token_id": 2,
}
EAGLE3_MIN_LAYERS = 4  # three distinct captured layers, each before a layer that exists
_DRAFT_COPY = (
    "hidden_size",
    "num_attention_heads",
    "vocab_size",
    "max_position_embeddings",
    "rms_norm_eps",
    "rope_theta",
    "rope_scaling",
    "hidden_act",
    "bos_token_id",
    "eos_token_id",
)


class SetupError(LabError):
    """The model could not be made from [serve] (a file missing or not a config): the lab's, not the stack's."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ModelFiles:
    target: Path
    draft: Path | None
    architecture: str
    layers: int
    notes: tuple[str, ...] = ()  # what was changed, for the stage's details


def _text(config: dict[str, Any]) -> dict[str, Any]:
    """The part of *config* that holds the language model (a multimodal wrapper's ``text_config``)."""
    inner = config.get("text_config")
    return inner if isinstance(inner, dict) and "num_hidden_layers" in inner else config


def shrink(config: dict[str, Any], layers: int) -> tuple[dict[str, Any], list[str]]:
    """A copy of *config* with *layers* layers, every width kept; and what changed, in words."""
    out = copy.deepcopy(config)
    text = _text(out)
    where = "text_config." if text is not out else ""
    old = text.get("num_hidden_layers")
    if not isinstance(old, int) or isinstance(old, bool) or old < 1:
        raise SetupError(f"config.json has no {where}num_hidden_layers (an integer): is it a model's config?")
    layers = min(layers, old)
    notes = [f"{where}num_hidden_layers {old} -> {layers}"] if layers != old else []
    text["num_hidden_layers"] = layers
    for key in ("first_k_dense_replace", "max_window_layers"):
        value = text.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > layers - 1 and value > 0:
            new = max(layers - 1, 0)
            text[key] = new
            notes.append(
                f"{where}{key} {value} -> {new} (so that a MoE layer remains)"
                if key == "first_k_dense_replace"
                else f"{where}{key} {value} -> {new}"
            )
    for key, value in list(text.items()):
        if isinstance(value, list) and len(value) == old and old != layers:
            text[key] = value[:layers]
            notes.append(f"{where}{key}: first {layers} of {old} entries")
    return out, notes


def draft_config(target: dict[str, Any], layers: int = 1) -> dict[str, Any]:
    """An EAGLE-3 draft for *target*: ``LlamaForCausalLMEagle3`` at its width, heads and vocabulary."""
    text = _text(target)
    draft = {k: text[k] for k in _DRAFT_COPY if k in text}
    hidden, heads = int(text["hidden_size"]), int(text["num_attention_heads"])
    kv = min(int(text.get("num_key_value_heads") or heads), heads)
    if "kv_lora_rank" in text or hidden % heads or hidden // heads not in (64, 128, 256):
        # MLA (DeepSeek-V3, Kimi-K2: 7168 / 128 heads = 56) has no Llama head shape: 128-wide heads, 8 KV heads.
        heads = hidden // 128
        kv = 8 if heads % 8 == 0 else heads
    draft.update(
        architectures=["LlamaForCausalLMEagle3"],
        model_type="llama",
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=hidden // heads,
        intermediate_size=int(text.get("intermediate_size") or 4 * int(text["hidden_size"])),
        draft_vocab_size=int(text["vocab_size"]),
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    draft.setdefault("hidden_act", "silu")
    draft.setdefault("rms_norm_eps", 1e-6)
    return draft


def aux_layer_ids(layers: int) -> list[int]:
    """The three target layers whose outputs EAGLE-3 feeds its draft, for a target of *layers* layers.

    SGLang captures the hidden state entering layer ``id + 1`` (``set_eagle3_layers_to_capture``), so each
    id is at most ``layers - 2``, and the three must differ; without them it takes ``[2, L // 2, L - 3]``,
    which for a shrunk target names layers that do not exist (a 3072-against-1024 shape error at start).
    """
    return [0, (layers - 1) // 2, layers - 2]


def _ids(value: object) -> list[int]:
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


def tokenizer_json(vocab_size: int, bos: object, eos: object) -> tuple[dict[str, Any], dict[str, Any]]:
    """(tokenizer.json, tokenizer_config.json) of a word-level tokenizer of exactly *vocab_size* tokens.

    Token *i* is ``w<i>``; the BOS and EOS ids (an int or a list, as configs write them) are ``<s>`` and
    ``</s>`` (further EOS ids ``</s1>`` …), id 0 ``<unk>`` unless that is BOS or EOS.
    """
    names: dict[int, str] = {}
    for i in _ids(bos)[:1]:
        names[i] = "<s>"
    for n, i in enumerate(_ids(eos)):
        names.setdefault(i, "</s>" if n == 0 else f"</s{n}>")
    unk = next(i for i in range(vocab_size) if i not in names)
    names[unk] = "<unk>"
    vocab = {names.get(i, f"w{i}"): i for i in range(vocab_size)}
    added = [
        {
            "id": i,
            "content": t,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for i, t in sorted(names.items())
        if i < vocab_size
    ]
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": None,
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True},
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"},
    }
    settings: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": "<unk>",
        "model_max_length": 1 << 20,
    }
    settings.update(
        {f"{kind}_token": token for kind, token, ids in (("bos", "<s>", bos), ("eos", "</s>", eos)) if _ids(ids)}
    )
    return tokenizer, settings


def _read_config(path: Path, key: str) -> dict[str, Any]:
    file = path / "config.json" if path.is_dir() else path
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SetupError(
            f"serve.{key}: {file} does not exist; give the model's config.json (a file, never "
            "downloaded) or drop the key for the built-in model"
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SetupError(f"serve.{key}: cannot read {file} as JSON: {exc}") from None
    if not isinstance(data, dict):
        raise SetupError(f"serve.{key}: {file} is not a JSON object; is it a model's config.json?")
    return data


def _write(folder: Path, config: dict[str, Any], tokenizer: Path | None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=1) + "\n", encoding="utf-8")
    text = _text(config)
    if tokenizer is not None:
        if not tokenizer.is_dir():
            raise SetupError(f"serve.tokenizer: {tokenizer} is not a folder of tokenizer files")
        for f in tokenizer.iterdir():
            if f.is_file() and (f.name.startswith(("tokenizer", "special_tokens")) or f.suffix == ".model"):
                shutil.copyfile(f, folder / f.name)
    else:
        tok, settings = tokenizer_json(int(text["vocab_size"]), text.get("bos_token_id"), text.get("eos_token_id"))
        (folder / "tokenizer.json").write_text(json.dumps(tok), encoding="utf-8")
        (folder / "tokenizer_config.json").write_text(json.dumps(settings, indent=1), encoding="utf-8")
    generation = {k: text[k] for k in ("bos_token_id", "eos_token_id") if k in text}
    (folder / "generation_config.json").write_text(json.dumps(generation) + "\n", encoding="utf-8")


def make_model(
    out: Path,
    *,
    model: Path | None,
    layers: int,
    tokenizer: Path | None = None,
    draft: Path | None = None,
    draft_layers: int = 1,
    eagle3: bool = True,
) -> ModelFiles:
    """Write ``out/target`` (and ``out/draft``) for ``--model-path`` and ``--speculative-draft-model-path``."""
    source = _read_config(model, "model") if model is not None else BUILTIN
    raised = eagle3 and layers < EAGLE3_MIN_LAYERS
    target, notes = shrink(source, max(layers, EAGLE3_MIN_LAYERS) if eagle3 else layers)
    if raised and notes and notes[0].startswith(("num_", "text_config.num_")):
        notes[0] += f" (EAGLE-3 captures three hidden states: at least {EAGLE3_MIN_LAYERS} layers)"
    text = _text(target)
    if not isinstance(text.get("vocab_size"), int) or not isinstance(text.get("hidden_size"), int):
        raise SetupError("serve.model: the config has no vocab_size and hidden_size (integers)")
    _write(out / "target", target, tokenizer)
    arch = ", ".join(map(str, target.get("architectures") or [text.get("model_type", "?")]))
    draft_dir = None
    if eagle3:
        if draft is not None:
            made, draft_notes = shrink(_read_config(draft, "draft"), draft_layers)
            notes += [f"draft: {n}" for n in draft_notes]
        else:
            made = draft_config(target, draft_layers)
            notes.append(f"draft: LlamaForCausalLMEagle3, {draft_layers} layer(s), derived from the target")
        ids = aux_layer_ids(text["num_hidden_layers"])
        made["eagle_config"] = {
            **(made.get("eagle_config") or {}),
            "eagle_aux_hidden_state_layer_ids": ids,
            "use_aux_hidden_state": True,
        }
        notes.append(f"draft: eagle_config.eagle_aux_hidden_state_layer_ids {ids}")
        draft_dir = out / "draft"
        _write(draft_dir, made, tokenizer)
    return ModelFiles(
        target=out / "target", draft=draft_dir, architecture=arch, layers=text["num_hidden_layers"], notes=tuple(notes)
    )
