"""Reading an API request: its JSON body checked against the OpenAI shapes, its prompts
tokenized and sized against the model and the KV cache; every refusal an `APIError`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from pydantic import BaseModel, ValidationError

from kvlab.engine.sampler import SamplingParams
from kvlab.errors import KvlabError
from kvlab.policies.request import Request as EngineRequest
from kvlab.server.protocol import SamplingFields, describe_validation_error
from kvlab.server.service import EngineService

MAX_BODY_BYTES = 8 * 2**20  # a body larger than this is refused before it is parsed


class APIError(Exception):
    """A request the server refuses: its HTTP status, OpenAI error type and the field."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param

    @property
    def error_type(self) -> str:
        """OpenAI's name for the status (as vLLM writes it)."""
        return {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError",
                413: "RequestTooLargeError", 503: "ServiceUnavailableError"}.get(
                    self.status, "BadRequestError")


@dataclass(slots=True)
class Prepared:
    """One prompt ready to run: its text (when given as text), token ids and parameters."""

    text: str | None
    token_ids: list[int]
    params: SamplingParams


class RequestReader:
    """Reads the requests for one served model: parses bodies, tokenizes and checks prompts."""

    def __init__(self, service: EngineService, model_name: str) -> None:
        engine = service.engine
        self.model_name = model_name
        self.tokenizer = engine.tokenizer
        self.max_model_len = engine.max_model_len
        self.vocab_size = engine.model_config.vocab_size
        self._manager = engine.manager  # read-only here: its sizing rules

    async def parse(self, request: Request, model: type[BaseModel]) -> BaseModel:
        """The body as `model`, checked (size, JSON, fields, model name, n, stream options)."""
        size = 0
        chunks = []
        async for chunk in request.stream():
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                raise APIError(413, f"the request body is over {MAX_BODY_BYTES} bytes")
            chunks.append(chunk)
        try:
            data = json.loads(b"".join(chunks))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise APIError(400, f"the body is not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise APIError(400, "the body must be a JSON object")
        _refuse_unsupported(data)
        try:
            body = model.model_validate(data)
        except ValidationError as exc:
            message, param = describe_validation_error(exc)
            raise APIError(400, message, param) from None
        assert isinstance(body, SamplingFields)
        if body.model is not None and body.model != self.model_name:
            raise APIError(404, f"The model `{body.model}` does not exist.", "model")
        if body.n != 1:
            raise APIError(400, "n: only n=1 is supported", "n")
        if body.stream_options is not None and not body.stream:
            raise APIError(400, "stream_options can only be given with stream=true",
                           "stream_options")
        return body

    def tokenize(self, prompt: str | list[int], index: int) -> tuple[str | None, list[int]]:
        """(text, token ids) of prompt `index`: ids as given, or the text tokenized."""
        if isinstance(prompt, list):
            return None, prompt
        if self.tokenizer is None:
            raise APIError(400, f"prompt {index} is text, but model {self.model_name!r} has no "
                           "tokenizer: send token ids", "prompt")
        return prompt, list(self.tokenizer(prompt)["input_ids"])

    def prepare(self, text: str | None, ids: list[int], body: SamplingFields,
                max_tokens: int | None) -> Prepared:
        """A prompt checked against the vocabulary, the model length and the KV cache, with
        its sampling parameters."""
        if not ids:
            raise APIError(400, "the prompt is empty", "prompt")
        bad = next((t for t in ids if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise APIError(400, f"token id {bad} is outside the vocabulary "
                           f"[0, {self.vocab_size})", "prompt")
        if max_tokens is None:
            max_tokens = max(1, self.max_model_len - len(ids))
        if len(ids) + max_tokens > self.max_model_len:
            raise APIError(400, (
                f"This model's maximum context length is {self.max_model_len} tokens. However, you "
                f"requested {len(ids) + max_tokens} tokens ({len(ids)} in the prompt, "
                f"{max_tokens} in the completion). Please reduce the length of the prompt or "
                "of the completion."), "max_tokens")
        sized = EngineRequest(0, len(ids), max_tokens)
        manager = self._manager
        needed, num_pages = manager.pages_needed_alone(sized), manager.num_total_pages
        if needed > num_pages:
            raise APIError(400, f"the request needs {needed} KV pages but the cache has only "
                           f"{num_pages} ({manager.explain_pages_needed(sized)})", "max_tokens")
        try:
            params = SamplingParams(
                temperature=body.temperature, top_p=body.top_p, top_k=body.top_k,
                max_tokens=max_tokens, seed=body.seed, ignore_eos=body.ignore_eos,
                stop_token_ids=tuple(body.stop_token_ids),
            )
        except KvlabError as exc:
            raise APIError(400, str(exc)) from None
        return Prepared(text, ids, params)


# Fields that would change the answer and that kvlab serve does not implement: refused (400,
# naming the field) rather than answered without them. (value that asks for it, what it is)
UNSUPPORTED = {
    "logprobs": (lambda v: v not in (None, False, 0), "log probabilities"),
    "top_logprobs": (lambda v: v not in (None, 0), "log probabilities"),
    "echo": (lambda v: v not in (None, False), "the prompt echoed in the answer"),
    "best_of": (lambda v: v not in (None, 1), "a best of several samples"),
}


def _refuse_unsupported(data: dict[str, Any]) -> None:
    """An APIError (400) for the first field of UNSUPPORTED that asks for what it names."""
    for name, (asks, what) in UNSUPPORTED.items():
        if name in data and asks(data[name]):
            raise APIError(400, f"{name}: kvlab serve does not return {what}; leave {name} "
                           "unset", name)


def prompt_list(prompt: Any) -> list[str | list[int]]:
    """One prompt or a list of them (text, or token ids)."""
    if isinstance(prompt, str):
        return [prompt]
    if prompt and all(isinstance(item, int) for item in prompt):
        return [list(prompt)]
    if not prompt:
        raise APIError(400, "the prompt is empty", "prompt")
    return list(prompt)
