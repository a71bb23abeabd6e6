"""`kvlab export-model PRESET DIR`: a tiny preset as a Hugging Face folder (config.json,
model.safetensors, a word-level tokenizer over its whole vocabulary) that vLLM, transformers and
`kvlab serve DIR` load with the same weights as `kvlab serve PRESET`."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `kvlab export-model`."""
    parser.add_argument("model", metavar="PRESET", help="tiny-llama or tiny-qwen2")
    parser.add_argument("output", metavar="DIR", help="folder to write (created if absent)")
    parser.add_argument("--overwrite", action="store_true",
                        help="write into DIR even when it is not empty")


def run(args: argparse.Namespace) -> int:
    """Write the folder and say where."""
    from kvlab.engine.export import export_preset

    path = export_preset(args.model, args.output, overwrite=args.overwrite)
    print(f"Saved {args.model} to {path} (config.json, model.safetensors, tokenizer)")
    return 0
