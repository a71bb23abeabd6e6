"""The Llama family (Llama 2/3, Mistral, Qwen2/2.5), once, over a flat ragged batch with paged KV.

A step's tokens from every sequence are concatenated into one batch of T rows; the attention
metadata (block tables, context lengths, slot mapping) tells the kernel backend which rows belong
to which sequence and where their K and V live in the per-layer page caches.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from itertools import repeat
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from kvlab.engine.models.config import ModelConfig
from kvlab.engine.models.cpu_gemm import Linear, check_cpu_gemm, linear, new_linear, pack_weight
from kvlab.errors import KvlabError

# one (k_cache, v_cache) per layer, or (k_cache, v_cache, kv_quant) for quantized pages
KVCaches = Sequence[tuple[torch.Tensor, torch.Tensor] | tuple[torch.Tensor, torch.Tensor, Any]]


def rope_inv_freq(config: ModelConfig) -> torch.Tensor:
    """RoPE inverse frequencies [head_dim / 2] in float32, with the config's rope scaling."""
    dim = config.head_dim
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    inv_freq = 1.0 / (config.rope_theta**exponents)
    if config.rope_type == "linear":
        return inv_freq / float(config.rope_parameter("factor"))
    if config.rope_type == "llama3":
        return _llama3_inv_freq(inv_freq, config)
    return inv_freq


def _llama3_inv_freq(inv_freq: torch.Tensor, config: ModelConfig) -> torch.Tensor:
    """Llama 3.1 scaling: long wavelengths slowed by `factor`, short ones kept, a ramp between."""
    factor = float(config.rope_parameter("factor"))
    low_freq_factor = float(config.rope_parameter("low_freq_factor"))
    high_freq_factor = float(config.rope_parameter("high_freq_factor"))
    old_context_len = float(config.rope_parameter("original_max_position_embeddings"))
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding:
    """cos and sin tables for the positions of one batch (rotate-half layout, as transformers)."""

    def __init__(self, config: ModelConfig, device: torch.device | str) -> None:
        # Kept float32 and out of the module's buffers so that model.to(dtype) never rounds it.
        self.inv_freq = rope_inv_freq(config).to(device)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        """cos, sin of shape [T, head_dim] for int positions [T]."""
        freqs = positions.float()[:, None] * self.inv_freq.to(positions.device)[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [T, heads, head_dim] by the per-row angles in cos/sin [T, head_dim]."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


class RMSNorm(nn.Module):
    """Root-mean-square norm computed in float32, scaled by a learned weight."""

    def __init__(self, hidden_size: int, eps: float, **factory: Any) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(hidden_size, **factory))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalised x, same dtype as x."""
        if x.dtype == torch.float32 and x.device.type == "cpu":
            # torch's fused kernel, bit for bit the steps below on CPU in float32 (and 2-3x faster)
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class LlamaAttention(nn.Module):
    """Grouped-query self-attention whose K and V go to, and are read from, the paged cache.

    `sliding_window` is the layer's window in tokens (0: full attention).
    """

    def __init__(self, config: ModelConfig, sliding_window: int = 0, **factory: Any) -> None:
        super().__init__()
        self.sliding_window = sliding_window
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.scale = self.head_dim**-0.5
        self.qkv_proj = new_linear(
            config.hidden_size, self.q_size + 2 * self.kv_size, config.qkv_bias, **factory
        )
        self.o_proj = new_linear(self.q_size, config.hidden_size, config.o_proj_bias, **factory)

    def forward(
        self,
        hidden: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv_cache: tuple[torch.Tensor, torch.Tensor] | tuple[torch.Tensor, torch.Tensor, Any],
        meta: Any,
        backend: Any,
    ) -> torch.Tensor:
        """Attention output [T, hidden] for hidden [T, hidden]; writes this step's K/V first
        (quantized by the layer's kv_quant, the third item of `kv_cache` where there is one)."""
        num_tokens = hidden.shape[0]
        qkv = self.qkv_proj(hidden)
        # q and k side by side in qkv's rows: rotated together, one set of ops for both
        qk_heads = self.num_heads + self.num_kv_heads
        qk = qkv[:, : self.q_size + self.kv_size].view(num_tokens, qk_heads, self.head_dim)
        q, k = apply_rotary(qk, cos, sin).split([self.num_heads, self.num_kv_heads], dim=1)
        v = qkv[:, self.q_size + self.kv_size :].view(num_tokens, self.num_kv_heads, self.head_dim)
        k_cache, v_cache = kv_cache[0], kv_cache[1]
        # only a quantized cache passes kv_quant, so float pages reach any backend unchanged
        quant = {"kv_quant": kv_cache[2]} if len(kv_cache) == 3 else {}
        backend.write_kv(k, v, k_cache, v_cache, meta.slot_mapping, **quant)
        out = backend.paged_attention(
            q,
            k_cache,
            v_cache,
            meta,
            scale=self.scale,
            num_kv_heads=self.num_kv_heads,
            sliding_window=self.sliding_window,
            **quant,
        )
        return self.o_proj(out.reshape(num_tokens, self.q_size))


class LlamaMLP(nn.Module):
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x)), gate and up in one matmul."""

    def __init__(self, config: ModelConfig, **factory: Any) -> None:
        super().__init__()
        self.intermediate_size = config.intermediate_size
        self.gate_up_proj = new_linear(
            config.hidden_size, 2 * config.intermediate_size, config.mlp_bias, **factory
        )
        self.down_proj = new_linear(
            config.intermediate_size, config.hidden_size, config.mlp_bias, **factory
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """MLP output, same shape as x."""
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        # in place on this call's own temporary (inference only: no autograd graph)
        return self.down_proj(F.silu(gate, inplace=True).mul_(up))


class LlamaDecoderLayer(nn.Module):
    """Pre-norm transformer block: attention then MLP, each around a residual."""

    def __init__(self, config: ModelConfig, sliding_window: int = 0, **factory: Any) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, **factory)
        self.self_attn = LlamaAttention(config, sliding_window, **factory)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, **factory)
        self.mlp = LlamaMLP(config, **factory)

    def forward(
        self,
        hidden: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv_cache: tuple[torch.Tensor, torch.Tensor] | tuple[torch.Tensor, torch.Tensor, Any],
        meta: Any,
        backend: Any,
    ) -> torch.Tensor:
        """The block's output [T, hidden]."""
        attn = self.self_attn(self.input_layernorm(hidden), cos, sin, kv_cache, meta, backend)
        hidden = hidden + attn
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class LlamaModel(nn.Module):
    """Embedding, the decoder layers and the final norm."""

    def __init__(self, config: ModelConfig, **factory: Any) -> None:
        super().__init__()
        self.embed_tokens = nn.utils.skip_init(
            nn.Embedding, config.vocab_size, config.hidden_size, **factory
        )
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, window, **factory) for window in config.layer_windows
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, **factory)


class LlamaForCausalLM(nn.Module):
    """A Llama-family causal LM whose attention runs through a kernel backend over paged KV.

    `attn_backend` is any object with the kvlab.kernels backend methods `write_kv` and
    `paged_attention`. Parameters are created uninitialised: fill them from a checkpoint
    (`load_hf_weight`) or a preset's generator before use.
    """

    def __init__(
        self,
        config: ModelConfig,
        *,
        attn_backend: Any,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        super().__init__()
        factory = {"dtype": dtype, "device": device}
        self.config = config
        self.attn_backend = attn_backend
        self.model = LlamaModel(config, **factory)
        self.lm_head = (
            None
            if config.tie_word_embeddings
            else new_linear(config.hidden_size, config.vocab_size, False, **factory)
        )
        self.rotary = RotaryEmbedding(config, device)
        self.requires_grad_(False)  # an inference engine: never build autograd graphs
        self.cpu_gemm = "torch"
        self._tied_packed: torch.Tensor | None = None  # the embedding's, for tied logits
        self._packs_stale = False  # weights loaded since the last packing

    def use_cpu_gemm(self, name: str) -> None:
        """Run the linear layers' CPU matmuls through `name`: "onednn" (oneDNN on packed
        copies of the weights for decode-sized batches, kvlab.engine.models.cpu_gemm; on other
        devices and dtypes it changes nothing) or "torch" (F.linear only, the default).

        Raises KvlabError for another name. Weights loaded later are packed again before use.
        """
        self.cpu_gemm = check_cpu_gemm(name)
        self._pack_weights()

    def _pack_weights(self) -> None:
        """Packed copies of every linear's weight (and the logits' weight) for `cpu_gemm`."""
        onednn = self.cpu_gemm == "onednn"
        for module in self.modules():
            if isinstance(module, Linear):
                module.packed = pack_weight(module.weight) if onednn else None
        # an LM head is one of the linears; tied logits read the embedding, packed once more
        tied = onednn and self.lm_head is None
        self._tied_packed = pack_weight(self.model.embed_tokens.weight) if tied else None
        self._packs_stale = False

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: KVCaches,
        meta: Any,
    ) -> torch.Tensor:
        """Final hidden states [T, hidden] for the flat batch input_ids [T] at positions [T].

        `kv_caches[i]` is layer i's (k_cache, v_cache), each [num_pages, page_size,
        num_kv_heads, head_dim], or for quantized pages (k_cache, v_cache, kv_quant) (pages as
        kvkernels/kv_quant.py stores them, `KVCache.layers`); `meta` is the step's kvlab.kernels
        AttentionMetadata, or a list or tuple of one per layer (each layer reads its KV-cache
        group's block tables).
        """
        num_layers = len(self.model.layers)
        if len(kv_caches) != num_layers:
            raise ValueError(f"{len(kv_caches)} KV caches for {num_layers} layers")
        metas: Iterable[Any] = repeat(meta)
        if isinstance(meta, list | tuple):
            if len(meta) != num_layers:
                raise ValueError(f"{len(meta)} attention metadata for {num_layers} layers")
            metas = meta
        if self._packs_stale:
            self._pack_weights()
        hidden = self.model.embed_tokens(input_ids)
        cos, sin = self.rotary.cos_sin(positions, hidden.dtype)
        for layer, kv_cache, layer_meta in zip(self.model.layers, kv_caches, metas, strict=False):
            hidden = layer(hidden, cos, sin, kv_cache, layer_meta, self.attn_backend)
        return self.model.norm(hidden)

    def compute_logits(self, hidden_rows: torch.Tensor) -> torch.Tensor:
        """Logits [N, vocab] for the hidden rows that sample (only those, to save the matmul)."""
        if self._packs_stale:
            self._pack_weights()
        if self.lm_head is not None:
            return self.lm_head(hidden_rows)
        return linear(hidden_rows, self.model.embed_tokens.weight, None, self._tied_packed)

    def hf_weight_names(self) -> list[str]:
        """The Hugging Face tensor names this model needs from a checkpoint."""
        return list(self._hf_targets())

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """The checkpoint tensors of this model by Hugging Face name: views of its parameters
        (a fused parameter's rows for each of its parts), what `load_hf_weight` reads back."""
        return {
            name: param.data if rows is None else param.data[rows[0] : rows[1]]
            for name, (param, rows) in self._hf_targets().items()
        }

    def load_hf_weight(self, name: str, tensor: torch.Tensor) -> None:
        """Copy one checkpoint tensor into its parameter (or its slice of a fused one).

        Raises KeyError for a name this model does not use; KvlabError for a wrong shape.
        """
        param, rows = self._hf_targets()[name]
        target = param.data if rows is None else param.data[rows[0] : rows[1]]
        if tuple(target.shape) != tuple(tensor.shape):
            raise KvlabError(
                f"tensor {name!r} has shape {list(tensor.shape)}, expected {list(target.shape)} "
                "from config.json"
            )
        target.copy_(tensor)
        self._packs_stale = self.cpu_gemm != "torch"

    def _hf_targets(self) -> dict[str, tuple[torch.Tensor, tuple[int, int] | None]]:
        """HF name -> (parameter, row range of a fused parameter or None for all of it)."""
        cfg = self.config
        targets: dict[str, tuple[torch.Tensor, tuple[int, int] | None]] = {
            "model.embed_tokens.weight": (self.model.embed_tokens.weight, None),
            "model.norm.weight": (self.model.norm.weight, None),
        }
        if self.lm_head is not None:
            targets["lm_head.weight"] = (self.lm_head.weight, None)
        q = cfg.num_attention_heads * cfg.head_dim
        kv = cfg.num_key_value_heads * cfg.head_dim
        inter = cfg.intermediate_size
        for i, layer in enumerate(cast(list[LlamaDecoderLayer], list(self.model.layers))):
            pre = f"model.layers.{i}"
            attn, mlp = layer.self_attn, layer.mlp
            targets[f"{pre}.input_layernorm.weight"] = (layer.input_layernorm.weight, None)
            targets[f"{pre}.post_attention_layernorm.weight"] = (
                layer.post_attention_layernorm.weight,
                None,
            )
            fused: dict[str, tuple[nn.Linear, tuple[int, int] | None]] = {
                "self_attn.q_proj": (attn.qkv_proj, (0, q)),
                "self_attn.k_proj": (attn.qkv_proj, (q, q + kv)),
                "self_attn.v_proj": (attn.qkv_proj, (q + kv, q + 2 * kv)),
                "self_attn.o_proj": (attn.o_proj, None),
                "mlp.gate_proj": (mlp.gate_up_proj, (0, inter)),
                "mlp.up_proj": (mlp.gate_up_proj, (inter, 2 * inter)),
                "mlp.down_proj": (mlp.down_proj, None),
            }
            for hf_name, (layer_linear, rows) in fused.items():
                targets[f"{pre}.{hf_name}.weight"] = (layer_linear.weight, rows)
                if layer_linear.bias is not None:
                    targets[f"{pre}.{hf_name}.bias"] = (layer_linear.bias, rows)
        return targets
