"""Loader for ShareGPT conversations: a JSON list of {"id", "conversations": [{"from", "value"}]}.

A request is the first "human" turn (the prompt) and the "gpt" turn right after it (the output);
entries without such a pair are skipped and counted in `metadata["num_skipped_entries"]`. Token
lengths come from a local Hugging Face tokenizer when one is given (prompt with special tokens,
output without, since generated tokens carry no BOS, and at least 1), else from an estimate of
4 characters per token, rounded up, at least 1. Each request keeps its prompt's text
(`prompt_text`: what `kvlab bench serve` sends). ShareGPT has no arrival times: every request
arrives at 0 unless `load_trace` resamples arrivals at a request rate. Requests keep file order:
unlike vLLM's benchmark, entries are not shuffled, so `num_prompts` takes the first N.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from kvlab.errors import KvlabError
from kvlab.traces.build import build_trace, check_num_prompts
from kvlab.traces.tabular import check_file
from kvlab.traces.types import Trace

CHARS_PER_TOKEN = 4
_WHAT = 'a ShareGPT JSON list of {"id", "conversations": [{"from", "value"}, ...]}'
_TOKENIZE_BATCH = 1024


def estimate_tokens(text: str) -> int:
    """Token count estimated from characters: ceil(len / 4), at least 1."""
    return max(1, math.ceil(len(text) / CHARS_PER_TOKEN))


def load_sharegpt(
    path: str | Path, *, num_prompts: int | None = None, tokenizer: str | Path | None = None
) -> Trace:
    """Load ShareGPT conversations as requests arriving at 0, in file order."""
    path = Path(path)
    check_num_prompts(num_prompts)
    entries = _read_entries(path)
    pairs = list(_prompt_output_pairs(path, entries))
    num_skipped = len(entries) - len(pairs)
    if tokenizer is None:
        kept = pairs[:num_prompts]
        input_lens = [estimate_tokens(p) for p, _ in kept]
        output_lens = [estimate_tokens(o) for _, o in kept]
        texts = [p for p, _ in kept]
        token_ids = None
        length_source = f"{CHARS_PER_TOKEN} characters per token"
    else:
        input_lens, output_lens, token_ids, texts, num_empty = _tokenize(pairs, tokenizer,
                                                                        num_prompts)
        num_skipped += num_empty
        length_source = f"tokenizer {tokenizer}"
    if not input_lens:
        raise KvlabError(f"{path}: no entry has a human turn followed by a gpt turn; "
                         f"expected {_WHAT}")
    return build_trace(
        path,
        "sharegpt",
        np.zeros(len(input_lens)),
        np.asarray(input_lens, dtype=np.int64),
        np.asarray(output_lens, dtype=np.int64),
        num_prompts=num_prompts,
        prompt_token_ids=token_ids,
        prompt_texts=texts,
        metadata={"num_skipped_entries": num_skipped, "length_source": length_source},
    )


def _read_entries(path: Path) -> list[Any]:
    check_file(path, _WHAT)
    try:
        with path.open(encoding="utf-8") as file:
            entries = json.load(file)
    except json.JSONDecodeError as err:
        raise KvlabError(f"{path} line {err.lineno}, column {err.colno}: not valid JSON "
                         f"({err.msg})") from None
    except UnicodeDecodeError as err:
        raise KvlabError(f"{path}: not a UTF-8 text file ({err.reason}); expected {_WHAT}") \
            from None
    if not isinstance(entries, list):
        raise KvlabError(f"{path}: the top level is not a JSON list; expected {_WHAT}")
    return entries


def _prompt_output_pairs(path: Path, entries: list[Any]) -> Iterator[tuple[str, str]]:
    """(prompt, output) texts of every entry holding a human turn followed by a gpt turn."""
    for index, entry in enumerate(entries):
        turns = _turns(path, index, entry)
        human = next((i for i, turn in enumerate(turns) if turn["from"] == "human"), None)
        if human is not None and human + 1 < len(turns) and turns[human + 1]["from"] == "gpt":
            yield turns[human]["value"], turns[human + 1]["value"]


def _turns(path: Path, index: int, entry: Any) -> list[dict[str, Any]]:
    """The checked turns of entry `index`; a malformed entry raises a KvlabError naming it."""
    where = f"{path} [{index}]"
    if not isinstance(entry, dict) or not isinstance(entry.get("conversations"), list):
        raise KvlabError(f'{where}: expected an object with a "conversations" list')
    where += f" (id {entry.get('id')!r})"
    turns: list[dict[str, Any]] = entry["conversations"]
    for number, turn in enumerate(turns):
        if not isinstance(turn, dict) or not isinstance(turn.get("from"), str) \
                or not isinstance(turn.get("value"), str):
            raise KvlabError(f'{where}, conversations[{number}]: expected an object with '
                             f'string "from" and "value", found {json.dumps(turn)[:60]}')
    return turns


def _tokenize(
    pairs: list[tuple[str, str]], tokenizer_path: str | Path, num_prompts: int | None
) -> tuple[list[int], list[int], list[tuple[int, ...]], list[str], int]:
    """Token counts, prompt ids and the prompts kept, from a local tokenizer, in batches, up
    to num_prompts pairs.

    A prompt that tokenizes to nothing cannot be a request: it is left out and counted (last).
    """
    tokenizer = load_tokenizer(tokenizer_path)
    limit = len(pairs) if num_prompts is None else num_prompts
    input_lens: list[int] = []
    output_lens: list[int] = []
    token_ids: list[tuple[int, ...]] = []
    texts: list[str] = []
    num_empty = 0
    for start in range(0, len(pairs), _TOKENIZE_BATCH):
        batch = pairs[start:start + _TOKENIZE_BATCH]
        prompts = tokenizer([p for p, _ in batch])["input_ids"]
        outputs = tokenizer([o for _, o in batch], add_special_tokens=False)["input_ids"]
        for (text, _), prompt_ids, output_ids in zip(batch, prompts, outputs, strict=True):
            if len(token_ids) == limit:
                break
            if not prompt_ids:
                num_empty += 1
                continue
            texts.append(text)
            token_ids.append(tuple(prompt_ids))
            input_lens.append(len(prompt_ids))
            output_lens.append(max(1, len(output_ids)))
        if len(token_ids) == limit:
            break
    return input_lens, output_lens, token_ids, texts, num_empty


def load_tokenizer(path: str | Path) -> Any:
    """A Hugging Face tokenizer from a local folder (transformers imported only here)."""
    folder = Path(path)
    if not folder.is_dir():
        raise KvlabError(f"tokenizer {path}: no such folder; expected a local Hugging Face "
                         "tokenizer folder (tokenizer.json or tokenizer_config.json)",
                         parameters=("tokenizer",))
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise KvlabError(f"tokenizer {path}: needs the transformers package "
                         "(pip install transformers)",
                         parameters=("tokenizer",)) from None
    try:
        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError) as err:
        raise KvlabError(f"tokenizer {path}: not a loadable tokenizer folder "
                         f"({str(err).splitlines()[0]})",
                         parameters=("tokenizer",)) from None
