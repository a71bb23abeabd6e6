"""Names `make lint`'s dead-code check (vulture, configured in pyproject.toml) cannot see used.

Each line is a name that is used where vulture does not look: by another program (vLLM, pytest,
Hugging Face tokenizers, uvicorn), by Python itself, or by name at run time. A name that is
really unused is deleted, never listed here.
"""

# ruff: noqa: B018, F821

# Python: a module's lazy attribute lookup (engine/__init__.py)
__getattr__
# attributes set on Hugging Face tokenizers and configs, read by the tokenizers library
_.pre_tokenizer
_.decoder
_.post_processor
_.eos_token_id
# uvicorn reads it (tests/live_server.py); importlib reads a module's __spec__ (npu emulation)
_.should_exit
_.__spec__
# vLLM loads these by name: the offloading connector's `cache_policy_module_path` classes and
# the block pool's free queue walk (integrations/vllm/)
KvlabLRU
KvlabFIFO
KvlabLFU
KvlabSLRU
KvlabARC
KvlabCost
_.iter_blocks_after
insertion_only_keys  # a parameter of vLLM's OffloadingPolicy.on_request_finished
# kernel backends, made by name from the registry in kvkernels/backend.py
NpuBackend
TorchBackend
# the TilePlan field that says which AscendC cores compute (read by people, in the tests' output)
_.cube_vector
# step-table columns, read by name through STEP_COLUMNS (metrics/records.py)
_.num_running
_.num_waiting
_.num_swapped
_.num_preempted
_.num_swap_out_pages
_.num_swap_in_pages
_.num_copied_pages
# a field of the public MemoryUsage snapshot (policies/outputs.py), filled by every manager
_.num_host_total_pages
# the protocol that documents the batched eviction forms the managers call (policies/interfaces.py)
BatchedEviction
# a fake block pool's methods that vLLM's code calls (tests/integrations/test_vllm_support.py)
_.free_blocks
_.get_new_blocks
# tests/policies/step_walk.py: the count of refused calls, kept for a failing walk's debugger
_.num_refused
# benchmarks/manager_vs_vllm.py: a package module made by hand (the import system reads it)
_.__path__
