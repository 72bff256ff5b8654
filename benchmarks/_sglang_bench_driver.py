"""Runs SGLang's own benchmark client (``sglang.benchmark.serving``) with the interpreter of a throwaway venv.

Started by ``bench_vs_sglang.py`` as ``python _sglang_bench_driver.py TOKENIZER_DIR -- ARGS...``, where ARGS
are ``sglang.benchmark.serving``'s own command line. Two things it does before handing over:

- It makes the tiny word-level tokenizer the stand-in's tokens fit (``tokenizers`` + ``transformers``,
  saved to TOKENIZER_DIR), so that SGLang's retokenized counts and its ``random-ids`` prompts work offline.
- It imports ``sglang`` as a bare namespace package. ``sglang/__init__.py`` (and ``sglang.srt.utils``)
  import torch; the benchmark client does not need them. Two names it imports from ``sglang.srt`` are
  given here: ``FAKE_BOOTSTRAP_HOST`` (used only for fake prefill/decode runs) and the two URL joiners
  of ``sglang.srt.utils.network``. Every line of the request functions, the warm-up, the cache flush
  and ``calculate_metrics`` is SGLang's own.

This file runs under the throwaway venv's Python, not the lab's: it imports nothing from compatlab.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

WORDS = ("the", "model", "token", "fast", "kernel", "graph", "draft", "verify", "cache", "batch")


def make_tokenizer(where: Path) -> None:
    if (where / "tokenizer.json").is_file():
        return
    from tokenizers import Tokenizer, models, pre_tokenizers  # type: ignore[import-not-found]
    from transformers import PreTrainedTokenizerFast  # type: ignore[import-not-found]

    unknown = "[UNK]"  # the word-level vocabulary's unknown token (not a secret)
    vocab = {unknown: 0, **{w: i + 1 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=unknown))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token=unknown).save_pretrained(str(where))


def bare_sglang() -> None:
    import importlib.util

    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("sglang is not installed in this interpreter")
    root = Path(next(iter(spec.submodule_search_locations)))
    for name, path in (
        ("sglang", root),
        ("sglang.srt", root / "srt"),
        ("sglang.srt.utils", root / "srt/utils"),
        ("sglang.srt.disaggregation", root / "srt/disaggregation"),
    ):
        module = types.ModuleType(name)
        module.__path__ = [str(path)]
        sys.modules[name] = module
    disagg = types.ModuleType("sglang.srt.disaggregation.utils")
    disagg.FAKE_BOOTSTRAP_HOST = "2.2.2.2"  # type: ignore[attr-defined]
    network = types.ModuleType("sglang.srt.utils.network")
    network.resolve_base_url = lambda base_url, host, port: base_url or f"http://{host}:{port}"  # type: ignore[attr-defined]
    network.resolve_host_port = lambda base_url, host, port: base_url or f"{host}:{port}"  # type: ignore[attr-defined]
    sys.modules[disagg.__name__] = disagg
    sys.modules[network.__name__] = network


def main() -> int:
    tokenizer_dir, sep, *rest = sys.argv[1:]
    assert sep == "--", "usage: _sglang_bench_driver.py TOKENIZER_DIR -- ARGS..."
    make_tokenizer(Path(tokenizer_dir))
    bare_sglang()
    from sglang.benchmark.serving import cli_main  # type: ignore[import-not-found]

    sys.argv = ["sglang.benchmark.serving", *rest]
    cli_main()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
