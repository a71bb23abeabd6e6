"""A model's shape as the KV-cache memory and the cost model see it."""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvlab.errors import KvlabError


@dataclass(slots=True, frozen=True, kw_only=True)
class ModelSpec:
    """A transformer's dimensions, parameter counts and KV-cache layout.

    `dtype_bytes` is the KV-cache element size and, unless `weight_dtype_bytes` says otherwise, the
    weights'. MoE models keep every expert in memory (`num_params`) but compute with
    `num_active_params` per token. MLA models (DeepSeek) set `kv_lora_rank` and
    `qk_rope_head_dim`: they cache one latent of that width per token per layer, not K and V.
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

    @property
    def is_mla(self) -> bool:
        """True for multi-head latent attention (one shared latent cached per token and layer)."""
        return self.kv_lora_rank is not None

    @property
    def is_moe(self) -> bool:
        """True when a token computes with fewer parameters than the model holds."""
        return self.num_active_params < self.num_params

    def kv_bytes_per_token(self, tensor_parallel_size: int = 1) -> int:
        """Bytes of KV cache one token takes on each device, all layers together.

        Tensor parallelism gives each device ceil(num_kv_heads / tp) KV heads; with tp above
        num_kv_heads, devices hold replicated copies of one head each, so memory stops shrinking.
        An MLA latent is shared by all heads and is replicated on every device, never split.
        """
        check_positive_tp(tensor_parallel_size)
        if self.kv_lora_rank is not None:
            latent = self.kv_lora_rank + (self.qk_rope_head_dim or 0)
            return self.num_layers * latent * self.dtype_bytes
        kv_heads = math.ceil(self.num_kv_heads / tensor_parallel_size)
        return 2 * self.num_layers * kv_heads * self.head_dim * self.dtype_bytes

    def weight_bytes(self, tensor_parallel_size: int = 1) -> int:
        """Bytes of weights each device holds: every parameter, split evenly across tp devices.

        The even split is vLLM's (column/row-parallel layers, vocab-parallel embeddings); the
        small replicated norms are ignored.
        """
        check_positive_tp(tensor_parallel_size)
        element = self.weight_dtype_bytes or self.dtype_bytes
        return math.ceil(self.num_params * element / tensor_parallel_size)

    def attention_flops_per_pair(self) -> int:
        """FLOPs of one (query, key) pair over all layers and heads: QK^T plus the value sum.

        MLA is counted in its prefill (non-absorbed) form: query-key width head_dim + rope dim.
        """
        qk_dim = self.head_dim + (self.qk_rope_head_dim or 0)
        return 2 * self.num_layers * self.num_heads * (qk_dim + self.head_dim)


def check_positive_tp(tensor_parallel_size: int) -> None:
    """Reject a tensor-parallel size below one (a user flag)."""
    if tensor_parallel_size < 1:
        raise KvlabError(
            f"tensor_parallel_size is {tensor_parallel_size}, expected a whole number >= 1",
            parameters=("tensor_parallel_size",),
        )
