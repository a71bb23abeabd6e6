"""How long an engine step, a swap, a page copy and a recomputation take: the cost-model interface
and its roofline default, built from a model and a hardware preset.

The roofline charges a step max(memory time, compute time) + collectives + a fixed overhead:

- memory: weights read once per step (an MoE batch touches min(all experts, active x tokens) of
  them, an upper bound that assumes tokens route to disjoint experts), KV read for every context
  token and written for every new token, in the KV cache's dtype (`ModelSpec.kv_cache_dtype`:
  an fp8 cache reads half the bytes of a bf16 one), over HBM bandwidth x BANDWIDTH_EFFICIENCY;
  a quantized cache also reads each new token's K and V in the model's dtype to quantize them
  (dequantizing inside attention is elementwise work in registers, not charged);
- compute: 2 FLOPs per active layer parameter per token, the LM head only for the one sampled
  token of each sequence (untied embeddings, as every preset has; the embedding lookup is free),
  plus attention per (query, key) pair, over peak FLOPs x FLOPS_EFFICIENCY (the fp16/bf16 peak,
  also for FP8 weights);
- with tensor parallelism, two ring all-reduces of the step's hidden states per layer (after
  attention and after the MLP) over the peer interconnect, not overlapped with compute.

A model whose layers do not all attend to every earlier token (sliding window, chunked local,
linear attention, DeepSeek-V3.2's sparse attention) has its attention terms charged per layer
kind instead (`kvlab.sim.layer_costs`); every other model's step costs what it always did.

Everything is float arithmetic on constants prepared in __init__: step_time_s runs once per
simulated step, ~100k times a simulation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from kvlab.sim.layer_costs import LayerCosts, has_layer_kinds
from kvlab.specs import HardwareSpec, ModelSpec, check_tensor_parallel
from kvlab.specs.kv_dtype import kv_cache_dtype

# Share of data-sheet peaks a serving engine reaches: ~80% of HBM bandwidth in decode GEMVs and
# attention, ~60% of dense FLOPs over a whole prefill (GEMMs plus lower-efficiency ops). Defaults
# to be replaced by `kvlab calibrate`'s fitted model.
BANDWIDTH_EFFICIENCY = 0.8
FLOPS_EFFICIENCY = 0.6


class StepShapeLike(Protocol):
    """Anything with a step's cost-relevant counts (StepShape, or the scheduler's output)."""

    @property
    def num_prefill_tokens(self) -> int: ...
    @property
    def num_decode_tokens(self) -> int: ...
    @property
    def num_context_tokens(self) -> int: ...
    @property
    def num_seqs(self) -> int: ...
    @property
    def num_attention_pairs(self) -> int: ...
    @property
    def num_padded_context_tokens(self) -> int: ...


@dataclass(slots=True)
class StepShape:
    """What one engine step's cost depends on (for tests and for fitting from profiles).

    `num_context_tokens` sums the KV tokens attention reads over the batch's requests;
    `num_attention_pairs` counts the (query, key) pairs of the prefill chunks, the quadratic term;
    `num_padded_context_tokens` is the decodes times the longest decode context: what attention
    reads when it pads the decode batch to its longest sequence (the torch reference backend).
    """

    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    num_context_tokens: int = 0
    num_seqs: int = 0
    num_attention_pairs: int = 0
    num_padded_context_tokens: int = 0


class CostModel(Protocol):
    """The simulator's clock: durations, in seconds, of the work an engine step implies."""

    def step_time_s(self, shape: StepShapeLike) -> float:
        """One engine step's duration (a forward pass over the batch). The shape is read
        during the call only: the simulator may reuse it for the next step."""
        ...

    def swap_time_s(self, num_pages: int, num_transfers: int) -> float:
        """Moving num_pages pages in num_transfers separate copies, one way over the host link."""
        ...

    def copy_time_s(self, num_pages: int) -> float:
        """Copying num_pages pages device to device (copy-on-write, block moves)."""
        ...

    def recompute_time_s(self, num_tokens: int) -> float:
        """Prefilling num_tokens tokens from scratch (what a recompute preemption costs)."""
        ...

    def demoted_read_time_s(self, num_saved_tokens: float) -> float:
        """What a step's reads of demoted pages cost beyond their bytes, given the context
        tokens (at the cache's dtype) their lower precision spares it (the step's time
        already counts that much less context: sim/precision_costs.py)."""
        ...

    def requantize_time_s(self, num_pages: float) -> float:
        """A step's requantizations, `num_pages` pages at the cache's dtype read and written,
        halved (`PrecisionDriver.requantized_pages`: a page copy's worth each)."""
        ...


class RooflineCostModel:
    """Step, swap, copy and recompute times from data-sheet figures (see the module docstring).

    Times are per device: with tensor parallelism every device works on its shard in parallel.
    """

    def __init__(
        self,
        model: ModelSpec,
        hardware: HardwareSpec,
        *,
        page_size: int,
        tensor_parallel_size: int = 1,
        bandwidth_efficiency: float = BANDWIDTH_EFFICIENCY,
        flops_efficiency: float = FLOPS_EFFICIENCY,
        page_bytes: int | None = None,
    ) -> None:
        """`page_bytes`: one KV page on one device, what copies and swaps move (default: the
        page's tokens in every attention layer; a hybrid model's pool page holds fewer)."""
        check_tensor_parallel(model, hardware, tensor_parallel_size)
        tp = tensor_parallel_size
        self.model = model
        self.hardware = hardware
        self.page_size = page_size
        self.tensor_parallel_size = tp
        kv_bytes = model.kv_bytes_per_token(tp)
        self.page_bytes = page_size * kv_bytes if page_bytes is None else page_bytes
        bandwidth = hardware.hbm_bandwidth * bandwidth_efficiency
        flops = hardware.peak_flops * flops_efficiency
        weight_element = model.weight_dtype_bytes or model.dtype_bytes
        lm_head_params = model.vocab_size * model.hidden_size
        layer_params = max(model.num_active_params - 2 * lm_head_params, 0.0)

        self._weights_s = model.weight_bytes(tp) / bandwidth
        self._active_weights_s_per_token = model.num_active_params * weight_element / tp / bandwidth
        self._kv_s_per_token = kv_bytes / bandwidth
        self._quantize_s_per_token = 0.0
        if kv_cache_dtype(model.kv_cache_dtype).is_quantized:  # K and V read to quantize
            full_kv_bytes = model.with_kv_cache_dtype("auto").kv_bytes_per_token(tp)
            self._quantize_s_per_token = full_kv_bytes / bandwidth
        self._linear_s_per_token = 2 * layer_params / tp / flops
        self._lm_head_s_per_seq = 2 * lm_head_params / tp / flops
        self._attention_s_per_pair = model.attention_flops_per_pair() / tp / flops
        self._allreduce_s_per_token, self._allreduce_s = self._allreduce_costs(model, hardware, tp)
        self._overhead_s = hardware.step_overhead_s
        self._copy_s_per_page = 2 * self.page_bytes / bandwidth  # read and write
        self._host_s_per_page = self.page_bytes / hardware.host_link_bandwidth
        self._host_latency_s = hardware.host_link_latency_s
        # attention per layer kind (None: every layer full attention, the terms above)
        self._layers = (LayerCosts(model, tp, bandwidth, flops) if has_layer_kinds(model)
                        else None)

    @staticmethod
    def _allreduce_costs(model: ModelSpec, hardware: HardwareSpec, tp: int) -> tuple[float, float]:
        """(seconds per batched token, fixed seconds) of a step's all-reduces; zero without TP."""
        if tp == 1:
            return 0.0, 0.0
        num_allreduces = 2 * model.num_layers
        # A ring all-reduce sends and receives 2 (tp - 1) / tp of the buffer on each device.
        ring_bytes = 2 * (tp - 1) / tp * model.hidden_size * model.dtype_bytes
        per_token = num_allreduces * ring_bytes / hardware.peer_bandwidth
        return per_token, num_allreduces * hardware.peer_latency_s

    def step_time_s(self, shape: StepShapeLike) -> float:
        """One engine step: max(memory, compute) + all-reduces + overhead; 0 when nothing runs.

        Decode attention pairs are taken as num_context_tokens (each decode token reads its whole
        context); this also counts the prefill chunks' context once more, a small overcount
        next to their num_attention_pairs.
        """
        num_tokens = shape.num_prefill_tokens + shape.num_decode_tokens
        if num_tokens <= 0:
            return 0.0
        if self._layers is not None:
            return self._layered_step_time_s(shape, num_tokens, _per_request(shape))
        num_context = shape.num_context_tokens
        memory_s = (
            (min(self._weights_s, self._active_weights_s_per_token * num_tokens)
             + num_tokens * self._quantize_s_per_token)
            + (num_context + num_tokens) * self._kv_s_per_token
        )
        compute_s = (
            num_tokens * self._linear_s_per_token
            + shape.num_seqs * self._lm_head_s_per_seq
            + (shape.num_attention_pairs + num_context) * self._attention_s_per_pair
        )
        collective_s = self._allreduce_s + num_tokens * self._allreduce_s_per_token
        return max(memory_s, compute_s) + collective_s + self._overhead_s

    def _layered_step_time_s(self, shape: StepShapeLike, num_tokens: int,
                             requests: tuple[list[int], list[int], list[bool]] | None) -> float:
        """`step_time_s` with attention charged per layer kind (`kvlab.sim.layer_costs`)."""
        assert self._layers is not None
        attention_memory_s, attention_compute_s = self._layers.step_s(
            num_tokens, shape.num_prefill_tokens, shape.num_seqs, shape.num_context_tokens,
            shape.num_attention_pairs, requests)
        memory_s = ((min(self._weights_s, self._active_weights_s_per_token * num_tokens)
                     + num_tokens * self._quantize_s_per_token) + attention_memory_s)
        compute_s = (num_tokens * self._linear_s_per_token
                     + shape.num_seqs * self._lm_head_s_per_seq + attention_compute_s)
        collective_s = self._allreduce_s + num_tokens * self._allreduce_s_per_token
        return max(memory_s, compute_s) + collective_s + self._overhead_s

    def decode_step_time(self, num_seqs: int) -> Callable[[int, int], float]:
        """`step_time_s` of a step of `num_seqs` decodes and nothing else, as a function of
        its context and padded context tokens: the same float operations in the same order,
        so the same durations, with the batch's terms computed once (`decode_step_timer`).
        A model with layer kinds is charged `step_time_s`'s bound from the aggregates."""
        if self._layers is not None:
            def layered_s(num_context: int, num_padded: int) -> float:
                shape = StepShape(0, num_seqs, num_context, num_seqs, 0, num_padded)
                return self._layered_step_time_s(shape, num_seqs, None)

            return layered_s
        weights_s = (min(self._weights_s, self._active_weights_s_per_token * num_seqs)
                     + num_seqs * self._quantize_s_per_token)
        kv_s, attention_s = self._kv_s_per_token, self._attention_s_per_pair
        linear_s = num_seqs * self._linear_s_per_token + num_seqs * self._lm_head_s_per_seq
        collective_s = self._allreduce_s + num_seqs * self._allreduce_s_per_token
        overhead_s = self._overhead_s

        def time_s(num_context: int, num_padded: int) -> float:
            return (max(weights_s + (num_context + num_seqs) * kv_s,
                        linear_s + num_context * attention_s)
                    + collective_s + overhead_s)

        return time_s

    def swap_time_s(self, num_pages: int, num_transfers: int) -> float:
        """Per-transfer latency plus bytes over the host link: many small swaps cost more."""
        return num_transfers * self._host_latency_s + num_pages * self._host_s_per_page

    def copy_time_s(self, num_pages: int) -> float:
        """Each page read and written once in HBM (copies are batched into one kernel)."""
        return num_pages * self._copy_s_per_page

    def demoted_read_time_s(self, num_saved_tokens: float) -> float:
        """0: a demoted page's read costs its bytes (a fused dequantizing kernel; its
        arithmetic hides under the memory traffic)."""
        return 0.0

    def requantize_time_s(self, num_pages: float) -> float:
        """A page copy's HBM time per page (read at one level, written at the other)."""
        return self.copy_time_s(1) * num_pages

    def recompute_time_s(self, num_tokens: int) -> float:
        """The step time of one sequence's prefill of num_tokens tokens, causal attention."""
        if num_tokens <= 0:
            return 0.0
        if self._layers is not None:  # one request, exact
            return self._layered_step_time_s(prefill_shape(num_tokens), num_tokens,
                                             ([num_tokens], [0], [False]))
        return self.step_time_s(prefill_shape(num_tokens))


def _per_request(shape: StepShapeLike) -> tuple[list[int], list[int], list[bool]] | None:
    """A scheduler output's (new tokens, computed tokens, is a decode) per request, or None
    for a shape without them (a `StepShape`)."""
    requests = getattr(shape, "requests", None)
    if requests is None:
        return None
    news: list[int] = shape.num_new_tokens  # type: ignore[attr-defined]
    computeds: list[int] = shape.num_computed_tokens  # type: ignore[attr-defined]
    decodes = [new == 1 and 0 < done == r.prompt_len + r.num_output_tokens - 1
               for r, new, done in zip(requests, news, computeds, strict=True)]
    return news, computeds, decodes


def decode_step_timer(cost_model: CostModel) -> Callable[[int], Callable[[int, int], float]] | None:
    """The cost model's own timer of decode-only steps (`decode_step_time`: given a batch size,
    a function of a step's context and padded context; the simulator's fast path asks it
    instead of building a shape per step), or None where it has none, or where `step_time_s`
    is a subclass's own (the timer would skip the override). A property of the model's class:
    resolve it once per model."""
    for klass in type(cost_model).__mro__:
        if "step_time_s" in vars(klass):
            if "decode_step_time" not in vars(klass):
                return None
            timer: Callable[[int], Callable[[int, int], float]] = (
                cost_model.decode_step_time)  # type: ignore[attr-defined]
            return timer
    return None


def prefill_shape(num_tokens: int) -> StepShape:
    """The step of one sequence's prefill of num_tokens tokens from scratch (causal attention):
    what recomputing a preempted sequence costs, in any cost model."""
    return StepShape(
        num_prefill_tokens=num_tokens,
        num_context_tokens=num_tokens,
        num_seqs=1,
        num_attention_pairs=num_tokens * (num_tokens + 1) // 2,
    )
