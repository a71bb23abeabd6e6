"""`kvlab accuracy MODEL --kv-cache-dtype fp8 int8 ...`: what each KV-cache precision costs the
model against its full-precision cache, on a text corpus (`kvlab.fidelity.accuracy`): logit KL
(mean, p99), top-1 agreement, perplexity and its change, greedy-output agreement.

    kvlab accuracy stdlib-llama --kv-cache-dtype fp8_e4m3 fp8_e5m2 int8 int8_per_token_head
    kvlab accuracy stdlib-llama --kv-cache-dtype fp8_e4m3 --precision age:recent=64,depth=2
    kvlab accuracy /models/Llama-3.1-8B --device cuda --kv-cache-dtype fp8 --corpus wiki.txt
"""

from __future__ import annotations

import argparse
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `kvlab accuracy`."""
    from kvlab.cli.commands.common import add_device_arguments
    from kvlab.fidelity.accuracy import AccuracyConfig
    from kvlab.specs.kv_dtype import kv_cache_dtype_names

    defaults = AccuracyConfig(model="", kv_cache_dtypes=("fp8",))
    parser.add_argument("model", metavar="MODEL",
                        help="a preset with a tokenizer (stdlib-llama) or a Hugging Face folder")
    parser.add_argument("--kv-cache-dtype", nargs="+", default=None, metavar="DTYPE",
                        choices=kv_cache_dtype_names(),
                        help="the precisions to measure against auto, vLLM's names "
                        f"({', '.join(kv_cache_dtype_names())}; default fp8_e4m3, none "
                        "with --precision)")
    parser.add_argument("--precision", nargs="+", default=[], metavar="SPEC",
                        help="precision policies to measure at auto, as a policy's "
                        "precision= value (age:recent=64,depth=2; kvlab policies): pages "
                        "demoted as the policy says, read back at their levels (default: "
                        "none, the dtypes only)")
    parser.add_argument("--corpus", default=None, metavar="TEXT_FILE",
                        help="UTF-8 text to score (default: the held-out Python standard "
                        "library modules stdlib-llama never saw)")
    parser.add_argument("--num-tokens", type=int, default=defaults.num_tokens,
                        help=f"positions scored, in whole windows (default {defaults.num_tokens})")
    parser.add_argument("--window", type=int, default=defaults.window,
                        help=f"tokens of context per window (default {defaults.window})")
    parser.add_argument("--chunk", type=int, default=defaults.chunk,
                        help="tokens a window is prefilled at a time: later chunks read the "
                        f"earlier ones from the cache (default {defaults.chunk})")
    parser.add_argument("--num-prompts", type=int, default=defaults.num_prompts,
                        help=f"greedy prompts from the corpus (default {defaults.num_prompts})")
    parser.add_argument("--prompt-len", type=int, default=defaults.prompt_len,
                        help=f"tokens per prompt (default {defaults.prompt_len})")
    parser.add_argument("--output-len", type=int, default=defaults.output_len,
                        help=f"greedy tokens per prompt (default {defaults.output_len})")
    parser.add_argument("--block-size", type=int, default=defaults.block_size,
                        help=f"tokens per KV page (default {defaults.block_size})")
    add_device_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")


def run(args: argparse.Namespace) -> int:
    """Measure and print a table (or JSON)."""
    import json
    import sys

    from kvlab.fidelity.accuracy import AccuracyConfig, measure_accuracy

    config = AccuracyConfig(
        model=args.model, precisions=tuple(args.precision),
        kv_cache_dtypes=tuple(args.kv_cache_dtype if args.kv_cache_dtype is not None
                              else [] if args.precision else ["fp8_e4m3"]), window=args.window,
        chunk=args.chunk, num_tokens=args.num_tokens, num_prompts=args.num_prompts,
        prompt_len=args.prompt_len, output_len=args.output_len, device=args.device,
        attention_backend=args.attention_backend, dtype=args.dtype, block_size=args.block_size,
        cpu_gemm=args.cpu_gemm)
    token_ids, source = corpus_tokens(args.model, args.corpus)
    results = measure_accuracy(config, token_ids,
                               progress=lambda line: print(line, file=sys.stderr))
    if args.json:
        print(json.dumps({"model": args.model, "corpus": source,
                          "results": [r.to_json() for r in results]}, indent=2))
        return 0
    print(format_accuracy(args.model, source, results))
    return 0


def corpus_tokens(model: str, corpus: str | None) -> tuple[list[int], str]:
    """The corpus as the model's tokens, and where it came from; a KvlabError for a model
    without a tokenizer or a file that cannot be read."""
    from pathlib import Path

    from kvlab.engine.loader import load_tokenizer, model_folder
    from kvlab.errors import KvlabError

    folder = model_folder(model)
    tokenizer = load_tokenizer(folder) if folder is not None and folder.is_dir() else None
    if tokenizer is None:
        raise KvlabError(f"model {model!r} has no tokenizer to read a text corpus with; give a "
                         "Hugging Face folder with tokenizer files, or stdlib-llama",
                         parameters=("model",))
    if corpus is None:
        from kvlab.engine.models.stdlib_llama.corpus import load_corpus

        text = "\n\n".join(s.text for s in load_corpus().split(held_out=True))
        source = "held-out Python standard library modules"
    else:
        try:
            text = Path(corpus).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise KvlabError(f"--corpus {corpus}: cannot read it as UTF-8 text ({exc})",
                             parameters=("corpus",)) from None
        source = corpus
    return list(tokenizer(text, verbose=False)["input_ids"]), source  # (windows cut later)


def format_accuracy(model: str, source: str, results: list[Any]) -> str:
    """One row per precision (a dtype, or auto with a precision policy): KL, top-1
    agreement, perplexity and its change, greedy agreement."""
    from kvlab.cli.commands.presets import format_table

    first = results[0]
    header = ("kv_cache_dtype", "precision", "KL mean", "KL p99", "top-1 agree %", "perplexity",
              "change", "greedy same", "greedy prefix %")
    rows = [[r.kv_cache_dtype, r.precision, f"{r.kl_mean:.2e}", f"{r.kl_p99:.2e}",
             f"{100 * r.top1_agreement:.2f}", f"{r.perplexity:.4f}",
             f"{r.perplexity_change:+.4f}", f"{r.greedy_identical}/{r.num_prompts}",
             f"{100 * r.greedy_prefix_share:.1f}"] for r in results]
    heading = (f"{model}: {first.num_tokens:,} positions of {source}; auto's perplexity "
               f"{first.reference_perplexity:.4f}")
    return heading + "\n" + format_table(header, rows)
