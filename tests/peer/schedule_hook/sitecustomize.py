"""Loaded by the peer's Python at start-up when this folder is on its PYTHONPATH (only
`start_vllm(log_schedule=True)` puts it there): logs vLLM's scheduler, step by step, to the JSON
lines file KVLAB_VLLM_SCHEDULE_LOG.<pid> of the process that schedules (the engine core).

It wraps three methods of vllm.v1.core.sched.scheduler.Scheduler once that module is imported,
changing nothing they do: `add_request` (a request reaches the engine: the order the scheduler
queues them in), `schedule` (each step's tokens per request, with the waiting count and the
free blocks after it) and `_preempt_request` (a victim, and the step). A test instrument for
tests/peer: it reads vLLM's internals, so it is tied to the vLLM version `make vllm-peer`
installs (0.32).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import sys
import time

LOG = os.environ.get("KVLAB_VLLM_SCHEDULE_LOG")
SCHEDULER_MODULE = "vllm.v1.core.sched.scheduler"


def _wrap(module) -> None:
    scheduler = module.Scheduler
    out = open(f"{LOG}.{os.getpid()}", "a", buffering=1)  # noqa: SIM115 (open for the run)
    add_request, schedule = scheduler.add_request, scheduler.schedule
    preempt = scheduler._preempt_request

    def write(**fields) -> None:
        out.write(json.dumps({"t": time.monotonic(), **fields}) + "\n")

    def logged_add_request(self, request, *args, **kwargs):
        write(add=request.request_id, prompt_len=request.num_prompt_tokens)
        return add_request(self, request, *args, **kwargs)

    def logged_schedule(self, *args, **kwargs):
        output = schedule(self, *args, **kwargs)
        if output.num_scheduled_tokens:
            write(step=self.current_step, tokens=output.num_scheduled_tokens,
                  waiting=len(self.waiting),
                  free=self.kv_cache_manager.block_pool.get_num_free_blocks())
        return output

    def logged_preempt(self, request, *args, **kwargs):
        write(preempt=request.request_id, step=self.current_step)
        return preempt(self, request, *args, **kwargs)

    scheduler.add_request, scheduler.schedule = logged_add_request, logged_schedule
    scheduler._preempt_request = logged_preempt


class _WrapOnImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != SCHEDULER_MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_wrap(module) -> None:
            exec_module(module)
            _wrap(module)

        spec.loader.exec_module = exec_and_wrap
        return spec


if LOG:
    sys.meta_path.insert(0, _WrapOnImport())
