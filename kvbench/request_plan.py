"""What `kvlab bench serve` sends: the served model's card, the vocabulary its prompt ids are
drawn from, and the trace's requests planned (text, or prompt ids) for the client.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvlab.bench.client import ClientConfig, PlannedRequest, get_json, is_chat_endpoint
from kvlab.errors import KvlabError
from kvlab.traces import Trace, synthesize_prompt_ids


def resolve_model(base_url: str, model: str | None, api_key: str | None) -> dict[str, Any]:
    """The /v1/models card of `model` (None: the server's first model); a KvlabError naming
    --model when the server does not serve it."""
    listing = get_json(base_url, "/v1/models", api_key=api_key)
    cards = listing.get("data") if isinstance(listing, dict) else None
    if not cards:
        raise KvlabError(f"{base_url}/v1/models lists no model", parameters=("base_url",))
    if model is None:
        return dict(cards[0])
    for card in cards:
        if card.get("id") == model:
            return dict(card)
    names = ", ".join(str(card.get("id")) for card in cards)
    raise KvlabError(f"model {model!r} is not served by {base_url} (it serves: {names})",
                     parameters=("model",))


def vocab_size_of(card: dict[str, Any], tokenizer: str | None, vocab_size: int | None) -> int:
    """The vocabulary the prompt ids are drawn from: `vocab_size` if given, else the
    config.json of the tokenizer folder (or of the model, when its id is a local folder), else
    the card's `vocab_size` (kvlab serve lists it); a KvlabError naming the flags otherwise."""
    if vocab_size is not None:
        if vocab_size < 1:
            raise KvlabError(f"vocab_size {vocab_size}: expected 1 or more",
                             parameters=("vocab_size",))
        return vocab_size
    for folder in (tokenizer, card.get("root"), card.get("id")):
        config = Path(str(folder)) / "config.json" if folder else None
        if config is not None and config.is_file():
            return _config_vocab(config)
    if isinstance(card.get("vocab_size"), int):
        return int(card["vocab_size"])
    raise KvlabError(
        f"cannot tell the vocabulary of model {card.get('id')!r}: give vocab_size N, or "
        "tokenizer FOLDER (a folder with the model's config.json)",
        parameters=("vocab_size", "tokenizer"),
    )


def _config_vocab(path: Path) -> int:
    try:
        value = json.loads(path.read_text(encoding="utf-8")).get("vocab_size")
    except (OSError, ValueError, AttributeError) as exc:
        raise KvlabError(f"{path}: cannot read vocab_size ({exc})") from None
    if not isinstance(value, int) or value < 1:
        raise KvlabError(f"{path}: vocab_size {value!r} is not a positive integer")
    return value


def plan_requests(trace: Trace, vocab_size: int, seed: int,
                  text_of: Callable[[list[int]], str] | None = None) -> list[PlannedRequest]:
    """The trace's requests, each to send at its arrival with its output length as
    max_tokens: its text where the trace has text (ShareGPT; the server tokenizes it), else
    prompt ids (`synthesize_prompt_ids`), turned into text by `text_of` when given (a
    tokenizer's decode: what a chat route needs)."""
    with_ids = synthesize_prompt_ids(trace, vocab_size, seed)
    planned = []
    for r in with_ids.requests:
        prompt: list[int] | str = (r.prompt_text if r.prompt_text is not None
                                   else list(r.prompt_token_ids or ()))
        if text_of is not None and not isinstance(prompt, str):
            prompt = text_of(prompt)
        planned.append(PlannedRequest(r.request_id, prompt, r.input_len, r.output_len,
                                      r.arrival_s, r.priority))
    return planned


def check_chat_prompts(client: ClientConfig, planned: list[PlannedRequest]) -> None:
    """A KvlabError before any request is sent when a chat route would get token ids."""
    if is_chat_endpoint(client.endpoint) and any(not isinstance(p.prompt, str)
                                                 for p in planned):
        raise KvlabError(
            f"--endpoint {client.endpoint} takes chat messages, which are text: give "
            "--tokenizer FOLDER (the served model's tokenizer) to turn the trace's prompt ids "
            "into text, or a dataset with text (--dataset-name sharegpt)",
            parameters=("tokenizer",))
