"""The engine's settings: a serving config (policy, limits, memory sizing) and how it runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvlab.policies.serving import ServingConfig


@dataclass(slots=True, frozen=True)
class EngineConfig:
    """Everything `LLMEngine` is built from; the names and defaults follow vLLM.

    `serving` holds what every world shares: the policy, the scheduler's limits and how KV
    memory is sized (`kv_cache_memory_bytes` is the way to size it on cpu). `model` is a preset
    or a Hugging Face folder; `device`, `attention_backend` and `dtype` say where and how it
    runs. `preemption_costs` replaces the startup measurement that `preemption=auto` otherwise
    runs. `step_timer` is how a step's duration is measured: `wall` (perf_counter), or `cpu`: the
    engine thread's CPU time, which ignores time other processes hold the cores. `cpu` is exact
    only on the cpu device with one torch thread (the caller sets torch.set_num_threads(1)).
    `warmup` runs the largest prefill a step can hold and a batch of up to 8 decodes once at
    start-up (ModelRunner.warm_up), so that the first steps measured are not slowed by one-off
    costs; it changes no output and no decision. `layer_groups[i]` is the KV-cache group whose
    block table layer i reads (an index into the manager's `block_tables(request)`); empty:
    every layer reads group 0, the one table of a single-table manager. `cpu_gemm` is how the
    model's linear layers multiply on CPU (float32, or bfloat16 where oneDNN has the CPU's
    bfloat16 instructions): `onednn` runs decode-sized batches through oneDNN on packed copies
    of the weights (faster, a second copy of the weights in memory; results agree with `torch`
    to about 1e-5, not bit for bit), `torch` runs F.linear only.
    """

    model: str
    device: str = "cpu"
    serving: ServingConfig = field(default_factory=ServingConfig)
    attention_backend: str = "torch"
    dtype: str | None = None
    preemption_costs: Any = None
    step_timer: str = "wall"
    warmup: bool = True
    layer_groups: tuple[int, ...] = ()
    cpu_gemm: str = "onednn"
