"""`LLM`: the offline API (vLLM's shape) over one LLMEngine."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

from kvlab.engine.config import EngineConfig
from kvlab.engine.engine import EngineRun, LLMEngine
from kvlab.engine.outputs import RequestOutput, request_output
from kvlab.engine.sampler import SamplingParams
from kvlab.errors import KvlabError
from kvlab.policies.serving import DEFAULT_SWAP_SPACE_BYTES, ServingConfig, parse_memory_size
from kvlab.policies.tiers import TiersConfig, parse_tiers

PromptLike = str | Sequence[int] | Mapping[str, Any]


class LLM:
    """Generate with a Llama-family model over a paged KV cache managed by a kvlab policy.

    `model` is a preset (`tiny-llama`, `tiny-qwen2`) or a local Hugging Face folder. `policy` is
    a spec such as "paged:eviction=lru,preemption=swap"; `block_size` overrides its page size.
    KV memory: `num_gpu_blocks_override` pages, else `kv_cache_memory` (bytes or "256MiB"), else
    on cuda/npu `gpu_memory_utilization` of the device minus weights and activations (4 GiB on
    cpu). `kv_tiers` puts a host tier below the device's prefix cache ("host:2GiB", or a
    TiersConfig; the engine runs host tiers only) and turns prefix caching on.
    `kv_cache_dtype` stores the pages in another precision (vLLM's names: auto, bfloat16,
    float16, fp8 / fp8_e4m3, fp8_e5m2, int8 (vLLM-Ascend's C8), int8_per_token_head,
    fp8_per_token_head, int4_per_token_head; kvkernels/kv_quant.py). A model with sliding-window
    layers runs vLLM's hybrid KV cache manager: `prefix_cache_retention_interval` (vLLM's:
    None caches every page leaving a window, 0 only what a hit at a prompt's end needs, R also
    what a hit at each multiple of R tokens needs), `hybrid_kv_cache_manager` False keeps every
    token in every layer (one full group). `scheduler_reserve_full_isl` (vLLM V1's default)
    admits a waiting request only when its whole prompt fits. `cpu_gemm` is how the linear
    layers multiply on CPU: "onednn" (decode-sized batches through oneDNN on packed weights,
    the default) or "torch" (F.linear only; EngineConfig says more). The two startup
    lines (KV cache size, maximum concurrency) are printed to stderr once unless `verbose` is
    False.
    """

    def __init__(
        self,
        model: str,
        device: str = "cpu",
        policy: Any = "paged",
        block_size: int | None = None,
        gpu_memory_utilization: float = 0.9,
        num_gpu_blocks_override: int | None = None,
        max_num_seqs: int = 256,
        max_num_batched_tokens: int = 8192,
        max_model_len: int | None = None,
        attention_backend: str = "torch",
        seed: int = 0,
        *,
        kv_cache_memory: int | str | None = None,
        swap_space: int | str = DEFAULT_SWAP_SPACE_BYTES,
        dtype: str | None = None,
        kv_cache_dtype: str = "auto",
        enable_chunked_prefill: bool = True,
        scheduler_reserve_full_isl: bool = True,
        enable_prefix_caching: bool = False,
        kv_tiers: Any = None,
        prefix_cache_retention_interval: int | None = None,
        hybrid_kv_cache_manager: bool = True,
        preemption_costs: Any = None,
        cpu_gemm: str = "onednn",
        verbose: bool = True,
    ) -> None:
        tiers = kv_tiers if isinstance(kv_tiers, TiersConfig) else \
            TiersConfig(parse_tiers(kv_tiers or ""))
        serving = ServingConfig.create(
            policy,
            block_size=block_size,
            enable_prefix_caching=enable_prefix_caching or bool(tiers),
            kv_tiers=tiers,
            gpu_memory_utilization=gpu_memory_utilization,
            num_gpu_blocks_override=num_gpu_blocks_override,
            kv_cache_memory_bytes=None
            if kv_cache_memory is None
            else parse_memory_size(kv_cache_memory, "kv_cache_memory"),
            swap_space_bytes=parse_memory_size(swap_space, "swap_space"),
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=max_model_len,
            enable_chunked_prefill=enable_chunked_prefill,
            scheduler_reserve_full_isl=scheduler_reserve_full_isl,
            seed=seed,
            kv_cache_dtype=kv_cache_dtype,
            prefix_cache_retention_interval=prefix_cache_retention_interval,
            hybrid_kv_cache_manager=hybrid_kv_cache_manager,
        )
        config = EngineConfig(
            model=str(model),
            device=device,
            serving=serving,
            attention_backend=attention_backend,
            dtype=dtype,
            preemption_costs=preemption_costs,
            cpu_gemm=cpu_gemm,
        )
        self.engine = LLMEngine(config)
        self.last_run: EngineRun | None = None  # per-step records of the latest generate()
        if verbose:
            for line in self.engine.startup_lines:
                print(line, file=sys.stderr)

    @property
    def tokenizer(self) -> Any:
        """The model folder's tokenizer (transformers), or None."""
        return self.engine.tokenizer

    def generate(
        self,
        prompts: PromptLike | Sequence[PromptLike],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Generate for every prompt; outputs come back in the order of the prompts.

        A prompt is a list of token ids, {"prompt_token_ids": [...]}, or a string (only when
        the model folder has a tokenizer). `sampling_params` is one for all prompts, one per
        prompt, or None (vLLM's defaults). All prompts arrive at once and run on the virtual
        clock, so the metrics are measured step times. A prompt the scheduler refuses (longer
        than max_model_len with its max_tokens) comes back with finish_reason "error" and an
        `error` message; the others run normally.
        """
        items = _as_prompt_list(prompts)
        params = _as_params_list(sampling_params, len(items))
        engine = self.engine
        tokenized = [self._tokenize(item, index) for index, item in enumerate(items)]
        for index, (_, ids) in enumerate(tokenized):  # all checked before any request is made
            try:
                engine.check_prompt(ids)
            except KvlabError as exc:
                raise KvlabError(f"prompt {index}: {exc}") from None
        texts = [text for text, _ in tokenized]
        requests = [
            engine.make_request(ids, param)
            for (_, ids), param in zip(tokenized, params, strict=True)
        ]
        self.last_run = engine.run(requests, replay="fast", progress=use_tqdm)
        return [
            request_output(request, text, self._detokenize(request.output_token_ids))
            for request, text in zip(requests, texts, strict=True)
        ]

    def _tokenize(self, item: PromptLike, index: int) -> tuple[str | None, list[int]]:
        if isinstance(item, str):
            if self.tokenizer is None:
                raise KvlabError(
                    f"prompt {index} is a string but model {self.engine.config.model!r} has no "
                    "tokenizer files; pass token ids instead"
                )
            return item, list(self.tokenizer(item)["input_ids"])
        if isinstance(item, Mapping):
            if "prompt_token_ids" not in item:
                raise KvlabError(f"prompt {index}: a dict prompt needs 'prompt_token_ids'")
            item = item["prompt_token_ids"]
        values = list(item)
        ids = [t for t in values if isinstance(t, int) and not isinstance(t, bool)]
        if len(ids) != len(values):
            raise KvlabError(f"prompt {index}: token ids must be whole numbers")
        return None, ids

    def _detokenize(self, token_ids: list[int]) -> str:
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)


def _as_prompt_list(prompts: PromptLike | Sequence[PromptLike]) -> list[PromptLike]:
    """A list of prompts from one prompt (a string, a dict or a flat list of ids) or many."""
    if isinstance(prompts, (str, Mapping)):
        return [prompts]
    items = list(prompts)
    ids = [t for t in items if isinstance(t, int)]
    if items and len(ids) == len(items):
        return [ids]  # one prompt given as a flat list of token ids
    if ids:
        raise KvlabError(
            "prompts: a list mixes token ids with other prompts; pass one prompt as a list of "
            "ids, or many prompts as a list of strings, id lists or dicts"
        )
    return [t for t in items if not isinstance(t, int)]


def _as_params_list(
    sampling_params: SamplingParams | Sequence[SamplingParams] | None, num_prompts: int
) -> list[SamplingParams]:
    if sampling_params is None:
        return [SamplingParams()] * num_prompts
    if isinstance(sampling_params, SamplingParams):
        return [sampling_params] * num_prompts
    params = list(sampling_params)
    if len(params) != num_prompts:
        raise KvlabError(
            f"{len(params)} SamplingParams for {num_prompts} prompts: give one for all, or one "
            "per prompt"
        )
    return params
