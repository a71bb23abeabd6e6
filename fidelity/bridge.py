"""The engine seen from the simulator: its model as a ModelSpec, its memory and scheduler as a
SimConfig, so that a simulation runs exactly the engine's instance."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from kvlab.sim import SimConfig
from kvlab.specs import ModelSpec

if TYPE_CHECKING:
    from kvlab.engine.engine import LLMEngine


def model_spec_for(engine: LLMEngine) -> ModelSpec:
    """The engine's model as a simulator ModelSpec (its shape, length limit and size), its KV
    cache in the engine's `kv_cache_dtype` (so both size a page alike, scales included)."""
    config = engine.model_config
    num_params = float(sum(p.numel() for p in engine.model.parameters()))
    dtype_bytes = next(engine.model.parameters()).element_size()
    spec = ModelSpec(
        name=str(engine.config.model),
        num_layers=config.num_hidden_layers,
        hidden_size=config.hidden_size,
        num_heads=config.num_attention_heads,
        num_kv_heads=config.num_key_value_heads,
        head_dim=config.head_dim,
        intermediate_size=config.intermediate_size,
        vocab_size=config.vocab_size,
        max_model_len=engine.max_model_len,
        num_params=num_params,
        num_active_params=num_params,
        dtype_bytes=dtype_bytes,
    )
    kv_cache_dtype = engine.config.serving.kv_cache_dtype
    return spec if kv_cache_dtype == "auto" else spec.with_kv_cache_dtype(kv_cache_dtype)


def sim_config_for(engine: LLMEngine) -> SimConfig:
    """A SimConfig that simulates exactly this engine's memory and scheduler."""
    policy = engine.policy
    if policy.preemption != "recompute" and policy.host_pages != engine.manager.num_host_pages:
        policy = policy.with_options(host_pages=engine.manager.num_host_pages)
    serving = dataclasses.replace(
        engine.config.serving,
        policy=policy,
        max_model_len=engine.max_model_len,
        num_gpu_blocks_override=engine.num_pages,
    )
    # hardware: unused, since the page count is given and the clock is calibrated
    return SimConfig(model=model_spec_for(engine), hardware="cpu", serving=serving)
