"""What `LLM.generate` returns, one `RequestOutput` per prompt, in vLLM's shape."""

from __future__ import annotations

from dataclasses import dataclass

from kvlab.policies.request import Request, RequestStatus

# vLLM's finish_reason strings; "error" marks a request the scheduler refused (too long).
FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
    RequestStatus.FINISHED_ERROR: "error",
}


@dataclass(slots=True)
class CompletionOutput:
    """One generated sequence: its token ids, its text (with a tokenizer) and why it ended.

    `stop_reason` is the stop token that ended it (eos or one of stop_token_ids), else None.
    """

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None
    stop_reason: int | None = None


@dataclass(slots=True)
class RequestMetrics:
    """A request's life on the engine clock, in seconds since the run started.

    The clock is the one the run used: virtual (measured step durations, the default of
    `generate`) or wall time. Token times are the end of the step that produced the token.
    """

    arrival_time: float
    first_scheduled_time: float | None
    first_token_time: float | None
    finished_time: float | None
    num_preemptions: int = 0
    num_swaps_out: int = 0

    @property
    def time_to_first_token(self) -> float | None:
        """Seconds from arrival to the first token (None when none was produced)."""
        if self.first_token_time is None:
            return None
        return self.first_token_time - self.arrival_time


@dataclass(slots=True)
class RequestOutput:
    """One prompt's result: the prompt, its completion(s), whether it finished, its metrics.

    `error` says why a request failed without running (finish_reason "error"), e.g. a prompt
    longer than max_model_len; the other requests of the batch are unaffected.
    """

    request_id: int
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    error: str | None = None


def request_output(request: Request, prompt: str | None, text: str = "") -> RequestOutput:
    """The RequestOutput of a request the engine has finished with."""
    assert request.prompt_token_ids is not None
    tokens = list(request.output_token_ids)
    reason = FINISH_REASONS.get(request.status)
    stop_reason = tokens[-1] if request.status is RequestStatus.FINISHED_STOPPED else None
    metrics = RequestMetrics(
        arrival_time=request.arrival_s,
        first_scheduled_time=request.first_scheduled_s,
        first_token_time=request.first_token_s,
        finished_time=request.finish_s,
        num_preemptions=request.num_preemptions,
        num_swaps_out=request.num_swaps_out,
    )
    return RequestOutput(
        request_id=request.request_id,
        prompt=prompt,
        prompt_token_ids=list(request.prompt_token_ids),
        outputs=[CompletionOutput(0, text, tokens, reason, stop_reason)],
        finished=request.is_finished,
        metrics=metrics,
        num_cached_tokens=request.num_cached_tokens,
        error=request.error,
    )
