"""Answering an API request: the prompts submitted to the engine service, their tokens
collected into one response or streamed as server-sent events (OpenAI's shapes, as vLLM's),
stop strings applied, everything aborted when the client leaves."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from kvlab.errors import KvlabError
from kvlab.server.parsing import APIError, Prepared
from kvlab.server.protocol import SamplingFields
from kvlab.server.service import EngineService, Event, Overloaded, Stream

DISCONNECT_POLL_S = 1.0  # how often a non-streaming request checks that its client is there


class Responder:
    """Runs checked prompts on the engine service and writes the response."""

    def __init__(self, service: EngineService, model_name: str) -> None:
        self._service = service
        self.model_name = model_name
        self._tokenizer = service.engine.tokenizer
        self._scheduling_policy = service.engine.config.serving.scheduling_policy

    async def respond(self, request: Request, body: SamplingFields, prepared: list[Prepared],
                      *, chat: bool) -> Response:
        """Run the prompts and answer: a stream of server-sent events, or the whole response."""
        if body.priority and not self._scheduling_policy.startswith("priority"):
            # as vLLM: a priority other than 0 is an error unless the server orders by it
            raise APIError(400, f"priority {body.priority}: the server schedules by "
                           f"{self._scheduling_policy}; a priority other than 0 needs "
                           "--scheduling-policy priority", "priority")
        loop = asyncio.get_running_loop()
        streams: list[Stream] = []
        try:
            # a whole response reads its tokens once, unless a stop string must be watched for
            each_token = body.stream or bool(body.stop_strings())
            for item in prepared:
                streams.append(self._service.submit(item.token_ids, item.params, loop,
                                              each_token=each_token, priority=body.priority))
        except Overloaded as exc:
            self._abort(streams)
            raise APIError(503, f"the server is busy: {exc}") from None
        except KvlabError as exc:  # a prompt the engine refuses (memory)
            self._abort(streams)
            raise APIError(400, str(exc), "prompt") from None
        outputs = [_Output(item, body.stop_strings(), self._tokenizer) for item in prepared]
        request_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        created = int(time.time())
        if body.stream:
            chunks = self._stream_chunks(streams, outputs, body, request_id, created, chat)
            return StreamingResponse(chunks, media_type="text/event-stream")
        if not await self._collect(request, streams, outputs):
            return Response(status_code=499)  # the client went away: nothing to send
        return JSONResponse(self._full_response(outputs, body, request_id, created, chat))

    async def _collect(self, request: Request, streams: list[Stream],
                       outputs: list[_Output]) -> bool:
        """Read every stream to its end; False (and everything aborted) if the client left."""
        pending = {asyncio.ensure_future(self._drain(stream, output)): stream
                   for stream, output in zip(streams, outputs, strict=True)}
        try:
            while pending:
                done, _ = await asyncio.wait(pending, timeout=DISCONNECT_POLL_S)
                for task in done:
                    pending.pop(task)
                if pending and await request.is_disconnected():
                    return False
            return True
        finally:
            for task in pending:
                task.cancel()
            self._abort([stream for stream, output in zip(streams, outputs, strict=True)
                    if output.finish_reason is None])

    async def _drain(self, stream: Stream, output: _Output) -> None:
        while output.finish_reason is None:
            if output.add(await stream.get()):
                self._service.abort(stream.request.request_id)  # a stop string: stop generating

    async def _stream_chunks(self, streams: list[Stream], outputs: list[_Output],
                             body: SamplingFields, request_id: str, created: int,
                             chat: bool) -> AsyncIterator[str]:
        events: asyncio.Queue[tuple[int, Event]] = asyncio.Queue()

        async def forward(index: int, stream: Stream) -> None:
            while True:
                event = await stream.get()
                await events.put((index, event))
                if event.finish_reason is not None:
                    return

        tasks = [asyncio.ensure_future(forward(i, s)) for i, s in enumerate(streams)]
        head = {"id": request_id, "created": created, "model": self.model_name,
                "object": "chat.completion.chunk" if chat else "text_completion"}
        try:
            if chat:
                yield _sse({**head, "choices": [{"index": 0, "delta": {"role": "assistant",
                            "content": ""}, "logprobs": None, "finish_reason": None}]})
            num_open, started = len(streams), set()
            while num_open:
                index, event = await events.get()
                output = outputs[index]
                if output.finish_reason is not None:
                    continue  # ended by a stop string; the engine's last events are stale
                start_ids = len(output.token_ids)
                if output.add(event):
                    self._service.abort(streams[index].request.request_id)
                text = output.text_to_send()
                choice = _stream_choice(output, index, text, start_ids, index not in started,
                                        body, chat)
                started.add(index)
                if output.finish_reason is not None:
                    num_open -= 1
                yield _sse({**head, "choices": [choice]})
            if body.stream_options is not None and body.stream_options.include_usage:
                yield _sse({**head, "choices": [], "usage": _usage(outputs)})
            yield "data: [DONE]\n\n"
        finally:
            for task in tasks:
                task.cancel()
            self._abort([stream for stream, output in zip(streams, outputs, strict=True)
                    if output.finish_reason is None])

    def _abort(self, streams: list[Stream]) -> None:
        for stream in streams:
            self._service.abort(stream.request.request_id)

    def _full_response(self, outputs: list[_Output], body: SamplingFields, request_id: str,
                       created: int, chat: bool) -> dict:
        choices = []
        for index, output in enumerate(outputs):
            choice: dict[str, Any] = {"index": index, "logprobs": None,
                                      "finish_reason": output.finish_reason,
                                      "stop_reason": output.stop_reason}
            if chat:
                choice["message"] = {"role": "assistant", "content": output.text}
            else:
                choice["text"] = output.text
            if body.return_token_ids:
                choice["prompt_token_ids"] = output.prompt_token_ids
                choice["token_ids"] = output.token_ids
            choices.append(choice)
        return {"id": request_id, "object": "chat.completion" if chat else "text_completion",
                "created": created, "model": self.model_name, "choices": choices,
                "usage": _usage(outputs)}


class _Output:
    """One choice as it grows: tokens, text, and why it ended (stop strings applied here: the
    engine knows only stop token ids)."""

    def __init__(self, prepared: Prepared, stops: list[str], tokenizer: Any) -> None:
        self.prompt_token_ids = prepared.token_ids
        self.token_ids: list[int] = []
        self.text = ""
        self.num_text_sent = 0
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None
        self._stops = stops
        self._tokenizer = tokenizer

    def add(self, event: Event) -> bool:
        """Take an event; True when a stop string just ended the choice."""
        self.token_ids += event.token_ids
        if self._tokenizer is not None and event.token_ids:
            self.text = self._tokenizer.decode(self.token_ids, skip_special_tokens=True)
        for stop in self._stops:
            at = self.text.find(stop)
            if at >= 0:
                self.text, self.finish_reason, self.stop_reason = self.text[:at], "stop", stop
                return True
        if event.finish_reason is not None:
            self.finish_reason = event.finish_reason
            if event.finish_reason == "stop" and self.token_ids:
                self.stop_reason = self.token_ids[-1]
        return False

    def text_to_send(self) -> str:
        """Text not streamed yet, holding back what could still become a stop string."""
        end = len(self.text)
        if self.finish_reason is None and self._stops:
            end = max(self.num_text_sent, end - max(len(stop) for stop in self._stops) + 1)
        text = self.text[self.num_text_sent:end]
        self.num_text_sent = end
        return text


def _stream_choice(output: _Output, index: int, text: str, start_ids: int, first: bool,
                   body: SamplingFields, chat: bool) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": index, "logprobs": None,
                              "finish_reason": output.finish_reason,
                              "stop_reason": output.stop_reason}
    if chat:
        choice["delta"] = {"content": text} if text else {}
    else:
        choice["text"] = text
    if body.return_token_ids:
        choice["token_ids"] = output.token_ids[start_ids:]
        if first:
            choice["prompt_token_ids"] = output.prompt_token_ids
    return choice


def _usage(outputs: list[_Output]) -> dict[str, int]:
    prompt = sum(len(output.prompt_token_ids) for output in outputs)
    completion = sum(len(output.token_ids) for output in outputs)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


def _sse(data: dict) -> str:
    return f"data: {json.dumps(data)}\n\n"
