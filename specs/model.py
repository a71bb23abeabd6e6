"""A model's shape as the KV-cache memory and the cost model see it."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from kvlab.errors import KvlabError
from kvlab.specs.kv_dtype import check_model, kv_cache_dtype

# vLLM's and Hugging Face's `layer_types` words: what one decoder layer keeps per request.
# full_attention: K and V (or an MLA latent) of every token; sliding_attention: of the last
# `sliding_window` tokens; chunked_attention: of the tokens of the current chunk of
# `attention_chunk_size` (Llama 4); linear_attention: a fixed-size state (Gated DeltaNet, Mamba).
LAYER_TYPES = ("full_attention", "sliding_attention", "chunked_attention", "linear_attention")
# DeepSeek-V3.2's lightning indexer caches one fp8 key of index_head_dim per token and layer,
# with one fp32 scale per 128 elements (vLLM's DeepseekV32IndexerCache: head_dim + head_dim //
# 128 * 4 bytes, 132 for index_head_dim 128), whatever the KV cache's dtype.
INDEXER_QUANT_BLOCK = 128


@dataclass(slots=True, frozen=True, kw_only=True)
class ModelSpec:
    """A transformer's dimensions, parameter counts and KV-cache layout.

    `dtype_bytes` is the KV-cache element size and, unless `weight_dtype_bytes` says otherwise, the
    weights'. MoE models keep every expert in memory (`num_params`) but compute with
    `num_active_params` per token. MLA models (DeepSeek) set `kv_lora_rank` and
    `qk_rope_head_dim`: they cache one latent of that width per token per layer, not K and V.

    Layer layout (defaults: every layer full attention, as before): `layer_types` gives each
    layer's kind in LAYER_TYPES words (empty: all `full_attention`); `sliding_window` (tokens a
    sliding layer attends to, itself included) and `attention_chunk_size` go with sliding and
    chunked layers. `linear_state_bytes` is the state one linear-attention layer keeps per
    request on one device at tensor parallel 1 (`kvlab.specs.linear_state` computes it from a
    config). `index_topk` / `index_head_dim` mark DeepSeek-V3.2's sparse attention: each token
    reads its top-k earlier tokens, picked by an indexer whose keys are cached too.
    `checkpoint_bytes` is the weights' size as stored, for quantized checkpoints that no whole
    bytes-per-parameter describes (gpt-oss's MXFP4 experts); None: num_params x element size.
    `kv_cache_dtype` is the KV cache's precision as served (vLLM's `--kv-cache-dtype` names,
    `kvlab.specs.kv_dtype`; `auto`: `dtype_bytes`): `with_kv_cache_dtype` sets it.
    """

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_model_len: int
    num_params: float
    num_active_params: float
    dtype_bytes: int = 2
    weight_dtype_bytes: int | None = None
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    layer_types: tuple[str, ...] = ()
    sliding_window: int | None = None
    attention_chunk_size: int | None = None
    linear_state_bytes: int | None = None
    index_topk: int | None = None
    index_head_dim: int | None = None
    checkpoint_bytes: int | None = None
    kv_cache_dtype: str = "auto"

    def with_kv_cache_dtype(self, name: str) -> ModelSpec:
        """This model served with its KV cache in precision `name` (its weights unchanged);
        a KvlabError for an unknown name or one the model's cache cannot take."""
        dtype = kv_cache_dtype(name)
        check_model(dtype, is_mla=self.is_mla, model_name=self.name)
        weights = self.weight_dtype_bytes or self.dtype_bytes
        return replace(self, kv_cache_dtype=dtype.name, weight_dtype_bytes=weights)

    @property
    def layer_kinds(self) -> tuple[str, ...]:
        """Each layer's kind in LAYER_TYPES words, one per layer (all full attention unless
        `layer_types` says otherwise)."""
        return self.layer_types or ("full_attention",) * self.num_layers

    @property
    def num_attention_layers(self) -> int:
        """Layers that cache per-token K and V (or a latent): all but linear-attention ones."""
        return sum(kind != "linear_attention" for kind in self.layer_kinds)

    @property
    def is_hybrid(self) -> bool:
        """True when the layers do not all keep the same kind of cache."""
        return len(set(self.layer_kinds)) > 1

    @property
    def is_mla(self) -> bool:
        """True for multi-head latent attention (one shared latent cached per token and layer)."""
        return self.kv_lora_rank is not None

    @property
    def is_moe(self) -> bool:
        """True when a token computes with fewer parameters than the model holds."""
        return self.num_active_params < self.num_params

    def kv_bytes_per_token(self, tensor_parallel_size: int = 1) -> int:
        """Bytes of KV cache one token takes on each device, all attention layers together.

        Tensor parallelism gives each device ceil(num_kv_heads / tp) KV heads; with tp above
        num_kv_heads, devices hold replicated copies of one head each, so memory stops shrinking.
        An MLA latent is shared by all heads and is replicated on every device, never split.
        Linear-attention layers cache no tokens (their state is `linear_state_bytes_per_device`);
        sliding and chunked layers count in full here (how many tokens they keep is the KV
        layout's business, `kvlab.specs.kv_layout`).
        """
        return self.num_attention_layers * self.kv_bytes_per_token_per_layer(tensor_parallel_size)

    def kv_bytes_per_token_per_layer(self, tensor_parallel_size: int = 1) -> int:
        """Bytes one token takes in one attention layer on each device (K and V, or the MLA
        latent plus, for DeepSeek-V3.2, its indexer key) in the `kv_cache_dtype`, per-token
        scales included (the indexer key stays fp8)."""
        check_positive_tp(tensor_parallel_size)
        dtype = kv_cache_dtype(self.kv_cache_dtype)
        if self.kv_lora_rank is not None:
            latent_dim = self.kv_lora_rank + (self.qk_rope_head_dim or 0)
            latent = dtype.latent_token_bytes(latent_dim, self.dtype_bytes)
            if self.index_head_dim is not None:
                latent += self.index_head_dim + self.index_head_dim // INDEXER_QUANT_BLOCK * 4
            return latent
        kv_heads = math.ceil(self.num_kv_heads / tensor_parallel_size)
        return 2 * kv_heads * dtype.head_token_bytes(self.head_dim, self.dtype_bytes)

    def linear_state_bytes_per_device(self, tensor_parallel_size: int = 1) -> int:
        """Bytes of one linear-attention layer's state for one request on each device (0 for a
        model without such layers). Gated DeltaNet and Mamba2 split their conv channels and
        heads evenly over the tensor-parallel devices, as vLLM does."""
        check_positive_tp(tensor_parallel_size)
        return math.ceil((self.linear_state_bytes or 0) / tensor_parallel_size)

    def weight_bytes(self, tensor_parallel_size: int = 1) -> int:
        """Bytes of weights each device holds: every parameter, split evenly across tp devices.

        The even split is vLLM's (column/row-parallel layers, vocab-parallel embeddings); the
        small replicated norms are ignored. `checkpoint_bytes`, when set, is the total split.
        """
        check_positive_tp(tensor_parallel_size)
        if self.checkpoint_bytes is not None:
            return math.ceil(self.checkpoint_bytes / tensor_parallel_size)
        element = self.weight_dtype_bytes or self.dtype_bytes
        return math.ceil(self.num_params * element / tensor_parallel_size)

    def attention_flops_per_pair(self) -> int:
        """FLOPs of one (query, key) pair over all layers and heads: QK^T plus the value sum.

        MLA is counted in its prefill (non-absorbed) form: query-key width head_dim + rope dim.
        """
        qk_dim = self.head_dim + (self.qk_rope_head_dim or 0)
        return 2 * self.num_attention_layers * self.num_heads * (qk_dim + self.head_dim)


def check_positive_tp(tensor_parallel_size: int) -> None:
    """Reject a tensor-parallel size below one (a user flag)."""
    if tensor_parallel_size < 1:
        raise KvlabError(
            f"tensor_parallel_size is {tensor_parallel_size}, expected a whole number >= 1",
            parameters=("tensor_parallel_size",),
        )
