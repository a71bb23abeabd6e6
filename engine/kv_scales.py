"""Each layer's static KV-cache scales for a quantized `kv_cache_dtype`, fixed at start-up.

- fp8_e4m3, fp8_e5m2: one K and one V scale per layer, as vLLM's `fp8`: read from the
  checkpoint where it has them, else 1.0 (vLLM's default). Accepted tensors, for layer i and
  `p = model.layers.{i}.self_attn` (the names vLLM's `maybe_remap_kv_scale_name` maps):
  `p.k_scale`/`p.v_scale`, `p.attn.k_scale`/`p.attn.v_scale`, ModelOpt's
  `p.k_proj.k_scale`/`p.v_proj.v_scale`, and the deprecated `p.kv_scale` (K's and V's).
  One element each and positive, as vLLM requires.
- int8 (vLLM-Ascend's C8): fp32 scales per KV head and channel, K and V: the checkpoint's
  `p.k_proj.kv_cache_scale`/`p.v_proj.kv_cache_scale` (msmodelslim's names, which
  vLLM-Ascend remaps to key/value_antiquant_scale; num_kv_heads x head_dim values, positive),
  their `kv_cache_offset`s zero or absent (kvlab's C8 is symmetric); else calibrated once: a
  prefill of CALIBRATION_NUM_TOKENS tokens (fewer where max_model_len is shorter) into a
  float cache, and each channel's scale is the absolute maximum of the K (or V) values it saw
  over 127 (kv_quant.calibrated_channel_scale). The tokens are real text where the model has
  a tokenizer (the start of the Python standard library corpus stdlib-llama trains on, which
  every machine has), else ids drawn uniformly from the vocabulary (torch.Generator seeded
  CALIBRATION_SEED). Random ids reach smaller keys and values than text does, so their
  scales clip text (kvlab accuracy on stdlib-llama: KL 1.4e-2, against 2.4e-3 with text).
  Both stand in for msmodelslim's calibration on a data set: load a calibrated checkpoint's
  scales for faithful accuracy.
- per-token-head precisions: none here (each row's scale is stored in its page).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from kvlab.engine.kv_cache import KVCache
from kvlab.engine.kv_sizing import model_dtype
from kvlab.engine.loader import load_kv_scale_tensors
from kvlab.engine.models.config import ModelConfig
from kvlab.engine.platform import Platform
from kvlab.errors import KvlabError
from kvlab.kernels.kv_quant import KVQuant, calibrated_channel_scale, check_head_dim
from kvlab.specs.kv_dtype import kv_cache_dtype

CALIBRATION_NUM_TOKENS = 256
CALIBRATION_SEED = 0
CALIBRATION_SEGMENTS = 64  # corpus definitions tokenized for the text prompt (enough for 256)


def layer_kv_quants(
    name: str,
    model: Any,
    config: ModelConfig,
    model_path: str,
    *,
    platform: Platform,
    page_size: int,
    max_model_len: int,
    tokenizer: Any = None,
) -> list[KVQuant] | None:
    """Each model layer's KVQuant for pages in precision `name` (None for float pages): its
    scales from the checkpoint at `model_path` (a folder; presets have none) or calibrated
    on `model` (int8; on text read with `tokenizer` where there is one)."""
    dtype = kv_cache_dtype(name)
    if not dtype.is_quantized:
        return None
    check_head_dim(dtype, config.head_dim)
    num_layers, head_dim = config.num_hidden_layers, config.head_dim
    if dtype.scales == "per_token_head":
        return [KVQuant(dtype, head_dim) for _ in range(num_layers)]
    tensors = load_kv_scale_tensors(model_path)
    if dtype.scales == "per_tensor":
        return [KVQuant(dtype, head_dim, *_tensor_scales(tensors, layer, dtype.name))
                for layer in range(num_layers)]
    shape = (config.num_key_value_heads, head_dim)
    loaded = [_channel_scales(tensors, layer, shape) for layer in range(num_layers)]
    scales = [found for found in loaded if found is not None]
    if not scales:
        scales = calibrate_channel_scales(model, config, platform=platform,
                                          page_size=page_size, max_model_len=max_model_len,
                                          tokenizer=tokenizer)
    elif len(scales) < num_layers:
        missing = next(layer for layer, found in enumerate(loaded) if found is None)
        raise KvlabError(
            f"the checkpoint has int8 KV-cache scales (kv_cache_scale) for some layers but not "
            f"for layer {missing}: kv_cache_dtype int8 takes every layer's, or none (then kvlab "
            "calibrates them)", parameters=("kv_cache_dtype",))
    device = platform.device
    return [KVQuant(dtype, head_dim, k_channel_scale=k.to(device), v_channel_scale=v.to(device))
            for k, v in scales]


def _tensor_scales(tensors: dict[str, torch.Tensor], layer: int, name: str,
                   ) -> tuple[float, float]:
    """Layer `layer`'s fp8 (k_scale, v_scale) from the checkpoint's tensors, 1.0 without."""
    prefix = f"model.layers.{layer}.self_attn"
    found: list[float] = []
    for side in ("k", "v"):
        names = (f"{prefix}.{side}_scale", f"{prefix}.attn.{side}_scale",
                 f"{prefix}.{side}_proj.{side}_scale", f"{prefix}.kv_scale")
        tensor = next((tensors[n] for n in names if n in tensors), None)
        if tensor is None:
            found.append(1.0)
            continue
        where = next(n for n in names if n in tensors)
        if tensor.numel() != 1:
            raise KvlabError(
                f"checkpoint tensor {where!r} holds {tensor.numel()} scales: kv_cache_dtype "
                f"{name} takes one per-tensor scale per layer (as vLLM's fp8)",
                parameters=("kv_cache_dtype",))
        value = float(tensor.float().item())
        if not (value > 0 and math.isfinite(value)):
            raise KvlabError(f"checkpoint tensor {where!r} is {value}: a KV-cache scale is "
                             "positive and finite", parameters=("kv_cache_dtype",))
        found.append(value)
    return found[0], found[1]


def _channel_scales(tensors: dict[str, torch.Tensor], layer: int, shape: tuple[int, int],
                    ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Layer `layer`'s C8 (K, V) scales [num_kv_heads, head_dim] from the checkpoint's
    tensors; None when it has neither."""
    prefix = f"model.layers.{layer}.self_attn"
    names = [f"{prefix}.{side}_proj.kv_cache_scale" for side in ("k", "v")]
    present = [n for n in names if n in tensors]
    if not present:
        return None
    if len(present) == 1:
        missing = next(n for n in names if n not in tensors)
        raise KvlabError(f"the checkpoint has {present[0]!r} but not {missing!r}: kv_cache_dtype "
                         "int8 takes static K and V scales together",
                         parameters=("kv_cache_dtype",))
    scales = []
    for name in names:
        offset = tensors.get(name.replace("kv_cache_scale", "kv_cache_offset"))
        if offset is not None and bool((offset != 0).any()):
            raise KvlabError(
                f"checkpoint tensor {name.replace('kv_cache_scale', 'kv_cache_offset')!r} is "
                "not zero: kvlab's int8 KV cache (C8) is symmetric and has no offsets",
                parameters=("kv_cache_dtype",))
        tensor = tensors[name].float()
        if tensor.numel() != math.prod(shape):
            raise KvlabError(
                f"checkpoint tensor {name!r} holds {tensor.numel()} scales; kv_cache_dtype int8 "
                f"takes one per KV head and channel ({shape[0]} x {shape[1]})",
                parameters=("kv_cache_dtype",))
        if not bool(((tensor > 0) & tensor.isfinite()).all()):
            raise KvlabError(f"checkpoint tensor {name!r} has scales that are not positive and "
                             "finite", parameters=("kv_cache_dtype",))
        scales.append(tensor.reshape(shape))
    return scales[0], scales[1]


def calibration_token_ids(vocab_size: int, num_tokens: int,
                          tokenizer: Any = None) -> torch.Tensor:
    """The calibration prompt: with a tokenizer, the first `num_tokens` tokens of the stdlib
    corpus's training text (`kvlab.engine.models.stdlib_llama.corpus`; the same on every
    machine with Python 3.10-3.13); without one, or where the text is too short, `num_tokens`
    ids drawn uniformly from the vocabulary by a CPU generator seeded CALIBRATION_SEED."""
    if tokenizer is not None:
        from kvlab.engine.models.stdlib_llama.corpus import load_corpus

        segments = load_corpus().split(held_out=False)[:CALIBRATION_SEGMENTS]
        text = "\n\n".join(s.text for s in segments)
        ids = list(tokenizer(text, verbose=False)["input_ids"])  # (no warning: cut below)
        if len(ids) >= num_tokens:
            return torch.tensor(ids[:num_tokens], dtype=torch.long)
    generator = torch.Generator(device="cpu").manual_seed(CALIBRATION_SEED)
    return torch.randint(vocab_size, (num_tokens,), generator=generator)


def calibrate_channel_scales(
    model: Any, config: ModelConfig, *, platform: Platform, page_size: int, max_model_len: int,
    tokenizer: Any = None,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's (K, V) int8 scales [num_kv_heads, head_dim] from one prefill of the
    calibration prompt (`calibration_token_ids`) into a float cache (the model's own dtype and
    backend)."""
    from kvlab.kernels import AttentionMetadata

    num_tokens = min(CALIBRATION_NUM_TOKENS, max_model_len)
    num_pages = -(-num_tokens // page_size)
    cache = KVCache.for_model(config, num_pages=num_pages, num_host_pages=0,
                              page_size=page_size, dtype=model_dtype(model), platform=platform,
                              backend=model.attn_backend)
    device = platform.device
    meta = AttentionMetadata.build(block_tables=[list(range(num_pages))], seq_lens=[num_tokens],
                                   query_lens=[num_tokens], page_size=page_size, device=device)
    ids = calibration_token_ids(config.vocab_size, num_tokens, tokenizer).to(device)
    with torch.inference_mode():
        model(ids, torch.arange(num_tokens, device=device), cache.layers(), meta)
    scales = []
    for k_cache, v_cache in zip(cache.k_caches, cache.v_caches, strict=True):
        k_seen = k_cache.view(-1, *k_cache.shape[2:])[:num_tokens].abs().amax(dim=0)
        v_seen = v_cache.view(-1, *v_cache.shape[2:])[:num_tokens].abs().amax(dim=0)
        scales.append((calibrated_channel_scale(k_seen).cpu(),
                       calibrated_channel_scale(v_seen).cpu()))
    return scales
