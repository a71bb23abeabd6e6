"""vLLM's scheduler, step by step, for `kvlab validate --lockstep --kv-events ... --step-log`:
with `KVLAB_VLLM_STEP_LOG=PATH` set, the plugin wraps three methods of vLLM's V1 `Scheduler`,
changing nothing they do, and the process that schedules (the engine core) writes JSON lines
to `PATH.<pid>`:

- `{"t", "add", "prompt_len"}`: a request reached the scheduler (`add_request`), in the order
  it queues them;
- `{"t", "step", "tokens", "waiting", "free"}`: a step that scheduled tokens (`schedule`): its
  tokens per request id, the requests left waiting and the free blocks after it;
- `{"t", "preempt", "step"}`: a request preempted (`_preempt_request`).

`t` is the engine's monotonic clock. kvlab replays its manager on these steps
(`kvlab.fidelity.step_log`) instead of reconstructing vLLM's steps from the tokens a client
sees stream back, so every step boundary is vLLM's own. The log reads vLLM's internals: it is
tied to the vLLM versions the plugin supports (`support.py`).
"""

from __future__ import annotations

import functools
import json
import os
import time
from typing import IO, Any

STEP_LOG_VARIABLE = "KVLAB_VLLM_STEP_LOG"
# The Scheduler methods the log wraps.
SCHEDULER_METHODS = ("add_request", "schedule", "_preempt_request")


class StepLogWriter:
    """JSON lines to `<stem>.<pid>`, the file opened at the first line (only the process that
    schedules writes one: the others import the scheduler and never call it)."""

    __slots__ = ("_out", "stem")

    def __init__(self, stem: str) -> None:
        self.stem = stem
        self._out: IO[str] | None = None

    def write(self, **fields: Any) -> None:
        """One line: the engine's clock, then `fields`."""
        if self._out is None:
            self._out = open(f"{self.stem}.{os.getpid()}", "a", buffering=1)  # noqa: SIM115
        self._out.write(json.dumps({"t": time.monotonic(), **fields}) + "\n")


def install_step_log(scheduler_cls: Any, writer: StepLogWriter) -> None:
    """Wrap `scheduler_cls` (vLLM's V1 Scheduler) so that its arrivals, steps and preemptions
    go to `writer`. Idempotent."""
    if getattr(scheduler_cls, "_kvlab_step_log", None) is not None:
        return
    add_request, schedule = scheduler_cls.add_request, scheduler_cls.schedule
    preempt = scheduler_cls._preempt_request

    @functools.wraps(add_request)
    def logged_add_request(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        writer.write(add=request.request_id, prompt_len=request.num_prompt_tokens)
        return add_request(self, request, *args, **kwargs)

    @functools.wraps(schedule)
    def logged_schedule(self: Any, *args: Any, **kwargs: Any) -> Any:
        output = schedule(self, *args, **kwargs)
        if output.num_scheduled_tokens:
            writer.write(step=self.current_step, tokens=output.num_scheduled_tokens,
                         waiting=len(self.waiting),
                         free=self.kv_cache_manager.block_pool.get_num_free_blocks())
        return output

    @functools.wraps(preempt)
    def logged_preempt(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        writer.write(preempt=request.request_id, step=self.current_step)
        return preempt(self, request, *args, **kwargs)

    scheduler_cls.add_request, scheduler_cls.schedule = logged_add_request, logged_schedule
    scheduler_cls._preempt_request = logged_preempt
    scheduler_cls._kvlab_step_log = writer.stem
