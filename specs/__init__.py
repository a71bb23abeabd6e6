"""Model and hardware presets, user spec files, and vLLM-style KV-cache sizing (torch-free)."""

from kvlab.specs.capacity import KVCapacity, estimate_activation_bytes, kv_cache_capacity_tokens
from kvlab.specs.hardware import HardwareSpec, check_tensor_parallel
from kvlab.specs.loading import get_hardware, get_model, list_hardware, list_models
from kvlab.specs.model import ModelSpec
from kvlab.specs.presets import DEFAULT_HARDWARE, DEFAULT_MODEL

__all__ = [
    "DEFAULT_HARDWARE",
    "DEFAULT_MODEL",
    "HardwareSpec",
    "KVCapacity",
    "ModelSpec",
    "check_tensor_parallel",
    "estimate_activation_bytes",
    "get_hardware",
    "get_model",
    "kv_cache_capacity_tokens",
    "list_hardware",
    "list_models",
]
