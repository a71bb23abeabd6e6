"""Named model and hardware presets: published configs and data-sheet figures.

Model dimensions come from each model's Hugging Face `config.json` (named per preset); parameter
counts of dense models are those configs' exact totals (embeddings and untied LM head included).
Hardware figures are vendor data-sheet values except where marked [secondary] (only third-party
pages confirm them) or [estimate] (our default, meant to be calibrated with `kvlab calibrate`).
"""

from __future__ import annotations

from kvlab.specs.hardware import HardwareSpec
from kvlab.specs.model import ModelSpec

GiB = 1024**3
MiB = 1024**2

# Presets stay in compact blocks that read like a data sheet, so the formatter leaves them.
# fmt: off
# What the simulator runs when no --model / --hardware is given (CLI and dashboard alike).
DEFAULT_MODEL = "llama-2-7b"
DEFAULT_HARDWARE = "a100-80g"

MODEL_PRESETS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        # meta-llama/Llama-2-7b-hf config.json
        ModelSpec(
            name="llama-2-7b", num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=32,
            head_dim=128, intermediate_size=11008, vocab_size=32000, max_model_len=4096,
            num_params=6_738_415_616, num_active_params=6_738_415_616,
        ),
        # meta-llama/Llama-2-13b-hf config.json
        ModelSpec(
            name="llama-2-13b", num_layers=40, hidden_size=5120, num_heads=40, num_kv_heads=40,
            head_dim=128, intermediate_size=13824, vocab_size=32000, max_model_len=4096,
            num_params=13_015_864_320, num_active_params=13_015_864_320,
        ),
        # meta-llama/Llama-2-70b-hf config.json
        ModelSpec(
            name="llama-2-70b", num_layers=80, hidden_size=8192, num_heads=64, num_kv_heads=8,
            head_dim=128, intermediate_size=28672, vocab_size=32000, max_model_len=4096,
            num_params=68_976_648_192, num_active_params=68_976_648_192,
        ),
        # meta-llama/Llama-3.1-8B config.json
        ModelSpec(
            name="llama-3.1-8b", num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8,
            head_dim=128, intermediate_size=14336, vocab_size=128256, max_model_len=131072,
            num_params=8_030_261_248, num_active_params=8_030_261_248,
        ),
        # meta-llama/Llama-3.1-70B config.json
        ModelSpec(
            name="llama-3.1-70b", num_layers=80, hidden_size=8192, num_heads=64, num_kv_heads=8,
            head_dim=128, intermediate_size=28672, vocab_size=128256, max_model_len=131072,
            num_params=70_553_706_496, num_active_params=70_553_706_496,
        ),
        # Qwen/Qwen2.5-7B-Instruct config.json (32K native; 128K only with YaRN)
        ModelSpec(
            name="qwen2.5-7b", num_layers=28, hidden_size=3584, num_heads=28, num_kv_heads=4,
            head_dim=128, intermediate_size=18944, vocab_size=152064, max_model_len=32768,
            num_params=7_615_616_512, num_active_params=7_615_616_512,
        ),
        # Qwen/Qwen2.5-72B-Instruct config.json
        ModelSpec(
            name="qwen2.5-72b", num_layers=80, hidden_size=8192, num_heads=64, num_kv_heads=8,
            head_dim=128, intermediate_size=29568, vocab_size=152064, max_model_len=32768,
            num_params=72_706_203_648, num_active_params=72_706_203_648,
        ),
        # internlm/internlm2-20b config.json
        ModelSpec(
            name="internlm2-20b", num_layers=48, hidden_size=6144, num_heads=48, num_kv_heads=8,
            head_dim=128, intermediate_size=16384, vocab_size=92544, max_model_len=32768,
            num_params=19_861_149_696, num_active_params=19_861_149_696,
        ),
        # mistralai/Mixtral-8x7B-v0.1 config.json: 8 experts, 2 per token; 46.7B total and
        # 12.9B active are Mistral's published figures (the config's dimensions sum to them).
        ModelSpec(
            name="mixtral-8x7b", num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8,
            head_dim=128, intermediate_size=14336, vocab_size=32000, max_model_len=32768,
            num_params=46_702_792_704, num_active_params=12_879_925_248,
        ),
        # deepseek-ai/DeepSeek-V3 config.json: MLA (kv_lora_rank 512, qk_rope_head_dim 64,
        # qk_nope_head_dim = v_head_dim = 128), 256 routed experts of which 8 per token; 671B total
        # and 37B active from the technical report (the MTP module is not counted). The released
        # weights are FP8 (1 byte); the KV latent stays bf16.
        ModelSpec(
            name="deepseek-v3", num_layers=61, hidden_size=7168, num_heads=128, num_kv_heads=128,
            head_dim=128, intermediate_size=18432, vocab_size=129280, max_model_len=163840,
            num_params=671e9, num_active_params=37e9, weight_dtype_bytes=1,
            kv_lora_rank=512, qk_rope_head_dim=64,
        ),
        # kvlab's engine presets (random fp32 weights, `kvlab export-model`): what `kvlab serve
        # tiny-llama` runs, for simulating that server (tests check they match the engine's)
        ModelSpec(
            name="tiny-llama", num_layers=2, hidden_size=128, num_heads=4, num_kv_heads=2,
            head_dim=32, intermediate_size=352, vocab_size=2048, max_model_len=2048,
            num_params=893_568, num_active_params=893_568, dtype_bytes=4,
        ),
        ModelSpec(
            name="tiny-qwen2", num_layers=2, hidden_size=128, num_heads=4, num_kv_heads=2,
            head_dim=32, intermediate_size=320, vocab_size=1536, max_model_len=4096,
            num_params=541_824, num_active_params=541_824, dtype_bytes=4,
        ),
    )
}

# Per-transfer host-link latency: one async copy call plus DMA setup, ~10 us on CUDA [estimate].
# Eager step overhead: Python and kernel-launch time a step does not overlap [estimate].
# Host DRAM per device (a bound for the host tier): an 8-device box with 1 TB (Atlas 800T A2)
# or 2 TB (HGX) of DRAM [estimate: common configurations]. RDMA per device: one 200 Gbps port
# per 910B, ~21.75 GB/s by Mooncake's 87 GB/s on 4x200 Gbps; one 400 Gbps NIC per GPU,
# ~23.75 GB/s by its 190 GB/s on 8x400 Gbps (FACTS.md).
HARDWARE_PRESETS: dict[str, HardwareSpec] = {
    spec.name: spec
    for spec in (
        # Ascend 910B, one card. 64 GB HBM (npu-smi: 65536 MB); ~1.6 TB/s [secondary];
        # 910B2 ~354 dense fp16 TFLOPS [secondary] (910B3 ~295, 910B4 ~246); PCIe generation
        # unconfirmed, Gen4 x16 assumed [secondary]; latency and overhead [estimate] (torch_npu
        # eager launches cost more than CUDA's).
        HardwareSpec(
            name="ascend-910b", hbm_bytes=64 * GiB, hbm_bandwidth=1.6e12, peak_flops=354e12,
            host_link_bandwidth=32e9, host_link_latency_s=20e-6, num_devices=1,
            step_overhead_s=5e-3, remote_bandwidth=21.75e9,
        ),
        # Atlas 800T A2: eight 910B (same per-device figures) joined by HCCS, a full mesh;
        # ~196 GB/s each way per NPU (392 GB/s bidirectional) [secondary], HCCL latency [estimate].
        HardwareSpec(
            name="atlas-800t-a2", hbm_bytes=64 * GiB, hbm_bandwidth=1.6e12, peak_flops=354e12,
            host_link_bandwidth=32e9, host_link_latency_s=20e-6, num_devices=8,
            step_overhead_s=5e-3, interconnect_bandwidth=196e9, interconnect_latency_s=20e-6,
            host_memory_bytes=128 * GiB, remote_bandwidth=21.75e9,
        ),
        # A100 80GB SXM data sheet: 2.039 TB/s, 312 dense bf16 TFLOPS, PCIe Gen4 (~32 GB/s each
        # way), NVLink 600 GB/s (300 each way); one GPU of an 8-GPU HGX box.
        HardwareSpec(
            name="a100-80g", hbm_bytes=80 * GiB, hbm_bandwidth=2.039e12, peak_flops=312e12,
            host_link_bandwidth=32e9, host_link_latency_s=10e-6, num_devices=8,
            step_overhead_s=3e-3, interconnect_bandwidth=300e9, interconnect_latency_s=10e-6,
            host_memory_bytes=256 * GiB,
        ),
        # H100 SXM data sheet: 3.35 TB/s, 989 dense bf16 TFLOPS, PCIe Gen5 (~64 GB/s each way),
        # NVLink 900 GB/s (450 each way); 8-GPU HGX box.
        HardwareSpec(
            name="h100-80g", hbm_bytes=80 * GiB, hbm_bandwidth=3.35e12, peak_flops=989e12,
            host_link_bandwidth=64e9, host_link_latency_s=10e-6, num_devices=8,
            step_overhead_s=3e-3, interconnect_bandwidth=450e9, interconnect_latency_s=10e-6,
            host_memory_bytes=256 * GiB,
        ),
        # H200 SXM data sheet: 141 GB (nvidia-smi: 143771 MiB), 4.8 TB/s (a device copy measures
        # ~4.3), ~989 dense bf16 TFLOPS (bf16 GEMM measures 770-800); links as H100.
        HardwareSpec(
            name="h200-141g", hbm_bytes=143771 * MiB, hbm_bandwidth=4.8e12, peak_flops=989e12,
            host_link_bandwidth=64e9, host_link_latency_s=10e-6, num_devices=8,
            step_overhead_s=3e-3, interconnect_bandwidth=450e9, interconnect_latency_s=10e-6,
            host_memory_bytes=256 * GiB,
        ),
        # A modest server CPU, meant to be calibrated: 64 GB DRAM at ~50 GB/s, ~1 TFLOPS bf16
        # (AVX-512/AMX class). "Swapping" is a memcpy in the same DRAM, so the host link is the
        # memory bandwidth with a call's latency.
        HardwareSpec(
            name="cpu", hbm_bytes=64 * GiB, hbm_bandwidth=50e9, peak_flops=1e12,
            host_link_bandwidth=50e9, host_link_latency_s=1e-6, num_devices=1,
            step_overhead_s=3e-3,
        ),
    )
}
# fmt: on
