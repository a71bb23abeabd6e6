"""kvlab.engine: the real paged inference engine (platform, KV cache, models, loop, `LLM` API).

`from kvlab.engine import LLM, SamplingParams` works; the names are imported on first use, so
importing a submodule (e.g. kvlab.engine.platform) does not build the whole engine.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "LLM": "kvlab.engine.llm",
    "LLMEngine": "kvlab.engine.engine",
    "EngineConfig": "kvlab.engine.config",
    "SamplingParams": "kvlab.engine.sampler",
    "RequestOutput": "kvlab.engine.outputs",
    "CompletionOutput": "kvlab.engine.outputs",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'kvlab.engine' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
