"""The OpenAI-compatible HTTP API over an `EngineService` (FastAPI, as vLLM's server).

`/v1/completions`, `/v1/chat/completions` (when the tokenizer has a chat template),
`/v1/models`, `/health`, `/version`, `/metrics`. Request and response shapes follow vLLM's
`vllm/entrypoints/openai/`; every user mistake is an OpenAI error JSON with a 4xx status.
The routes live here; reading a request is server/parsing.py's, answering it
server/responses.py's.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from kvlab import __version__
from kvlab.server.metrics import CONTENT_TYPE
from kvlab.server.parsing import APIError, RequestReader, prompt_list
from kvlab.server.protocol import ChatCompletionRequest, CompletionRequest, error_body
from kvlab.server.responses import Responder
from kvlab.server.service import EngineService


def build_app(service: EngineService, *, model_name: str, api_key: str | None = None) -> FastAPI:
    """The FastAPI app serving `service` under the model name `model_name`; with `api_key`,
    every /v1 route wants `Authorization: Bearer <api_key>`."""
    app = FastAPI(title="kvlab serve", version=__version__)
    reader, responder = RequestReader(service, model_name), Responder(service, model_name)
    tokenizer = reader.tokenizer
    has_chat_template = bool(getattr(tokenizer, "chat_template", None))

    _add_guards(app, api_key)

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/version")
    async def version() -> dict:
        return {"version": __version__}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(service.metrics.exposition(), media_type=CONTENT_TYPE)

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache() -> JSONResponse:
        # vLLM's dev-mode route: benchmarks and KV lockstep start from an empty cache.
        success = await asyncio.to_thread(service.reset_prefix_cache)
        return JSONResponse({"success": success}, status_code=200 if success else 409)

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{
            "id": model_name, "object": "model", "created": int(time.time()),
            "owned_by": "kvlab", "root": model_name, "max_model_len": reader.max_model_len,
            "vocab_size": reader.vocab_size,  # kvlab's: benchmark clients draw prompt ids below it
        }]}

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = await reader.parse(request, CompletionRequest)
        assert isinstance(body, CompletionRequest)
        prompts = prompt_list(body.prompt)
        prepared = [reader.prepare(text, ids, body, body.max_tokens) for text, ids in
                    (reader.tokenize(prompt, index) for index, prompt in enumerate(prompts))]
        return await responder.respond(request, body, prepared, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        body = await reader.parse(request, ChatCompletionRequest)
        assert isinstance(body, ChatCompletionRequest)
        if not has_chat_template:
            raise APIError(400, f"model {model_name!r} has no chat template: use "
                           "/v1/completions", "messages")
        messages = [message.model_dump() for message in body.messages]
        ids = list(tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                 tokenize=True, return_dict=False))
        prepared = reader.prepare(None, ids, body, body.max_completion_tokens or body.max_tokens)
        return await responder.respond(request, body, [prepared], chat=True)

    return app


def _add_guards(app: FastAPI, api_key: str | None) -> None:
    """Refusals as OpenAI error JSON, and the API key check (with `api_key`)."""

    @app.exception_handler(APIError)
    async def api_error(_: Request, err: APIError) -> JSONResponse:
        return JSONResponse(error_body(err.message, err.status, err.error_type, err.param),
                            status_code=err.status)

    @app.middleware("http")
    async def check_key(request: Request, call_next: Callable) -> Response:
        # /reset_prefix_cache changes state: it wants the key too (vLLM serves it only in
        # its dev mode)
        if api_key is not None and (request.url.path.startswith("/v1")
                                    or request.url.path == "/reset_prefix_cache"):
            given = request.headers.get("authorization", "")
            if not secrets.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
                return JSONResponse(
                    error_body("invalid or missing API key", 401, "AuthenticationError"),
                    status_code=401,
                )
        response: Response = await call_next(request)
        return response
