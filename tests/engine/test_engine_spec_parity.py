"""The simulator's view of kvlab's engine models equals the engine's: the `tiny-*` and
`stdlib-llama` sim presets (what `kvlab serve tiny-llama` is simulated as) and an HF folder read
without torch."""

from __future__ import annotations

import dataclasses

import pytest

from kvlab.engine.config import EngineConfig
from kvlab.engine.engine import LLMEngine
from kvlab.fidelity.bridge import model_spec_for
from kvlab.policies.serving import ServingConfig
from kvlab.specs import get_model


def engine_spec(model: str):
    serving = ServingConfig.create("paged:block_size=16", num_gpu_blocks_override=8)
    return model_spec_for(LLMEngine(EngineConfig(model=model, serving=serving)))


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen2", "stdlib-llama"])
def test_sim_presets_equal_the_engine_presets(preset):
    assert dataclasses.replace(get_model(preset), name=preset) == dataclasses.replace(
        engine_spec(preset), name=preset)


def test_an_hf_folder_reads_as_the_engine_loads_it(hf_tiny_llama):
    from_folder, from_engine = get_model(str(hf_tiny_llama)), engine_spec(str(hf_tiny_llama))
    ignore = {"name": "", "max_model_len": 0, "dtype_bytes": 0}
    assert dataclasses.replace(from_folder, **ignore) == dataclasses.replace(from_engine,
                                                                             **ignore)
