"""kvlab.engine: the real paged inference engine.

Modules: `platform` (cpu/cuda/npu: memory, streams), `models` (the Llama family, configs, tiny
presets), `loader` (`load_model`: preset or local Hugging Face folder), `sampler`
(`SamplingParams`, `Sampler`, `check_stop`), `kv_cache` (`CacheConfig`, sizing, `KVCache`
tensors and MemOps execution). Import from the modules; this package imports nothing itself, so
`import kvlab.engine` stays cheap.
"""
