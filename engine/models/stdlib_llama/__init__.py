"""stdlib-llama: a small Llama trained on the Python standard library's own source.

A real-text model every machine can rebuild offline, for accuracy numbers that mean something
(KV precisions, eviction): random weights change under any rounding, trained ones barely do.

corpus.py       the text: top-level definitions whose source is identical on Python 3.10-3.13
train.py        the tokenizer and the model: `python -m kvlab.engine.models.stdlib_llama.train DIR`
stdlib-llama/   the committed Hugging Face folder (bf16 weights, tokenizer, chat template) and
                training.json (corpus hash, seed, steps, held-out perplexity, training time);
                a folder name Python cannot import, so setuptools ships it as plain data
"""

from __future__ import annotations

from pathlib import Path

NAME = "stdlib-llama"
MODEL_DIR = Path(__file__).resolve().parent / NAME
