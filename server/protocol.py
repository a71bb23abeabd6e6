"""The OpenAI-compatible request bodies kvlab serves, with vLLM's names and defaults, and the
OpenAI error body. Unknown fields are ignored (clients send some kvlab does not use)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError

# One prompt: text, or token ids; a request carries one or a list of them.
TokenIds = list[StrictInt]
Prompt = str | TokenIds | list[str] | list[TokenIds]


class StreamOptions(BaseModel):
    """`stream_options`: with `include_usage`, a last chunk carries the token counts."""

    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class SamplingFields(BaseModel):
    """The fields completions and chat share: sampling, stopping, streaming."""

    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: StrictInt = Field(-1, ge=-1)
    seed: StrictInt | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[StrictInt] = Field(default_factory=list)
    ignore_eos: bool = False
    n: StrictInt = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    return_token_ids: bool = False  # vLLM's extension: the prompt's and the output's ids
    # vLLM's extension: the request's place under --scheduling-policy priority (lower first;
    # ignored by other policies)
    priority: StrictInt = 0

    def stop_strings(self) -> list[str]:
        """`stop` as a list of non-empty strings."""
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return [text for text in stops if text]


class CompletionRequest(SamplingFields):
    """`POST /v1/completions`."""

    prompt: Prompt
    max_tokens: StrictInt | None = Field(16, ge=1)


class ChatMessage(BaseModel):
    """One message of a conversation (text content)."""

    model_config = ConfigDict(extra="ignore")
    role: str
    content: str


class ChatCompletionRequest(SamplingFields):
    """`POST /v1/chat/completions`; `max_tokens` None means up to the model's length."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: StrictInt | None = Field(None, ge=1)
    max_completion_tokens: StrictInt | None = Field(None, ge=1)


def error_body(message: str, status: int, error_type: str, param: str | None = None) -> dict:
    """The OpenAI (and vLLM) error JSON."""
    return {"error": {"message": message, "type": error_type, "param": param, "code": status}}


def describe_validation_error(error: ValidationError) -> tuple[str, str | None]:
    """A one-line message and the first bad field of a body that did not validate."""
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"])
    message = f"{where}: {first['msg']}" if where else first["msg"]
    others = len(error.errors()) - 1
    if others:
        message += f" (and {others} more)"
    return message, where or None
