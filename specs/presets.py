"""Named model and hardware presets: published configs and data-sheet figures.

Model dimensions come from each model's Hugging Face `config.json` (named per preset); parameter
counts of dense models are those configs' exact totals (embeddings and untied LM head included).
Hardware figures are vendor data-sheet values except where marked [secondary] (only third-party
pages confirm them) or [estimate] (our default, meant to be calibrated with `kvlab calibrate`).
"""

from __future__ import annotations

from kvlab.specs.hardware import HardwareSpec
from kvlab.specs.linear_state import gated_delta_net_state_bytes
from kvlab.specs.model import ModelSpec

GiB = 1024**3
MiB = 1024**2


def repeat(pattern: tuple[str, ...], num_layers: int) -> tuple[str, ...]:
    """`layer_types` of `num_layers` layers repeating `pattern` from layer 0."""
    return tuple(pattern[i % len(pattern)] for i in range(num_layers))


SLIDING, FULL = "sliding_attention", "full_attention"
CHUNKED, LINEAR = "chunked_attention", "linear_attention"

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
        # --- Models of 2026: layer layouts (issue 47). Figures from each repo's config.json; the
        # fields read are named. Checked against vLLM 0.32's and transformers' config classes
        # (installed under .peer/vllm) where those set the layout; [unconfirmed] marks a figure
        # recalled from the model card that no source at hand could confirm.
        # openai/gpt-oss-120b config.json: num_hidden_layers 36, hidden_size 2880,
        # num_attention_heads 64, num_key_value_heads 8, head_dim 64, intermediate_size 2880
        # (per expert; num_local_experts 128, experts_per_token 4), vocab_size 201088,
        # max_position_embeddings 131072, sliding_window 128, layer_types alternating
        # sliding_attention / full_attention from layer 0. 116.83B total, 5.13B active and the
        # 60.8 GiB checkpoint (MXFP4 experts, bf16 attention) from the model card [unconfirmed].
        ModelSpec(
            name="gpt-oss-120b", num_layers=36, hidden_size=2880, num_heads=64, num_kv_heads=8,
            head_dim=64, intermediate_size=2880, vocab_size=201088, max_model_len=131072,
            num_params=116.83e9, num_active_params=5.13e9, checkpoint_bytes=int(60.8 * GiB),
            layer_types=repeat((SLIDING, FULL), 36), sliding_window=128,
        ),
        # openai/gpt-oss-20b config.json: as 120b but num_hidden_layers 24 and 32 experts;
        # 20.91B total, 3.61B active, 12.8 GiB checkpoint from the model card [unconfirmed].
        ModelSpec(
            name="gpt-oss-20b", num_layers=24, hidden_size=2880, num_heads=64, num_kv_heads=8,
            head_dim=64, intermediate_size=2880, vocab_size=201088, max_model_len=131072,
            num_params=20.91e9, num_active_params=3.61e9, checkpoint_bytes=int(12.8 * GiB),
            layer_types=repeat((SLIDING, FULL), 24), sliding_window=128,
        ),
        # google/gemma-3-27b-it config.json, text_config: num_hidden_layers 62, hidden_size
        # 5376, num_attention_heads 32, num_key_value_heads 16, head_dim 128, intermediate_size
        # 21504, vocab_size 262208, max_position_embeddings 131072, sliding_window 1024,
        # sliding_window_pattern 6 (layers 5, 11, ... global: transformers' Gemma3TextConfig).
        # 27.4B parameters with the vision tower, from the model page [unconfirmed].
        ModelSpec(
            name="gemma-3-27b", num_layers=62, hidden_size=5376, num_heads=32, num_kv_heads=16,
            head_dim=128, intermediate_size=21504, vocab_size=262208, max_model_len=131072,
            num_params=27.4e9, num_active_params=27.4e9,
            layer_types=repeat((SLIDING,) * 5 + (FULL,), 62), sliding_window=1024,
        ),
        # Qwen/Qwen3-8B config.json: num_hidden_layers 36, hidden_size 4096, num_attention_heads
        # 32, num_key_value_heads 8, head_dim 128, intermediate_size 12288, vocab_size 151936,
        # max_position_embeddings 40960, use_sliding_window false (all layers full), untied
        # embeddings; the dimensions (q/k norms included) sum to 8,190,735,360 parameters.
        ModelSpec(
            name="qwen3-8b", num_layers=36, hidden_size=4096, num_heads=32, num_kv_heads=8,
            head_dim=128, intermediate_size=12288, vocab_size=151936, max_model_len=40960,
            num_params=8_190_735_360, num_active_params=8_190_735_360,
        ),
        # Qwen/Qwen3-32B config.json: num_hidden_layers 64, hidden_size 5120, num_attention_heads
        # 64, num_key_value_heads 8, head_dim 128, intermediate_size 25600, vocab_size 151936,
        # max_position_embeddings 40960, use_sliding_window false; 32,762,123,264 parameters.
        ModelSpec(
            name="qwen3-32b", num_layers=64, hidden_size=5120, num_heads=64, num_kv_heads=8,
            head_dim=128, intermediate_size=25600, vocab_size=151936, max_model_len=40960,
            num_params=32_762_123_264, num_active_params=32_762_123_264,
        ),
        # Qwen/Qwen3-235B-A22B config.json: num_hidden_layers 94, hidden_size 4096,
        # num_attention_heads 64, num_key_value_heads 4, head_dim 128, intermediate_size 12288
        # (moe_intermediate_size 1536; num_experts 128, num_experts_per_tok 8), vocab_size
        # 151936, max_position_embeddings 40960; 235B total, 22B active from the model card.
        ModelSpec(
            name="qwen3-235b-a22b", num_layers=94, hidden_size=4096, num_heads=64,
            num_kv_heads=4, head_dim=128, intermediate_size=12288, vocab_size=151936,
            max_model_len=40960, num_params=235e9, num_active_params=22e9,
        ),
        # Qwen/Qwen3-Next-80B-A3B-Instruct config.json: num_hidden_layers 48, hidden_size 2048,
        # num_attention_heads 16, num_key_value_heads 2, head_dim 256, intermediate_size 5120,
        # vocab_size 151936, max_position_embeddings 262144, full_attention_interval 4 (layers
        # 3, 7, ... full, the rest Gated DeltaNet), linear_num_key_heads 16,
        # linear_num_value_heads 32, linear_key_head_dim 128, linear_value_head_dim 128,
        # linear_conv_kernel_dim 4 (confirmed by a copy of the config in the code corpus);
        # 80B total, 3B active from the model card.
        ModelSpec(
            name="qwen3-next-80b-a3b", num_layers=48, hidden_size=2048, num_heads=16,
            num_kv_heads=2, head_dim=256, intermediate_size=5120, vocab_size=151936,
            max_model_len=262144, num_params=80e9, num_active_params=3e9,
            layer_types=repeat((LINEAR,) * 3 + (FULL,), 48),
            linear_state_bytes=gated_delta_net_state_bytes(
                num_key_heads=16, num_value_heads=32, key_head_dim=128, value_head_dim=128,
                conv_kernel_dim=4, dtype_bytes=2),
        ),
        # meta-llama/Llama-4-Scout-17B-16E-Instruct config.json, text_config: num_hidden_layers
        # 48, hidden_size 5120, num_attention_heads 40, num_key_value_heads 8, head_dim 128,
        # intermediate_size 8192 (16 experts, 1 per token; intermediate_size_mlp 16384),
        # vocab_size 202048, max_position_embeddings 10485760, attention_chunk_size 8192,
        # no_rope_layers 0 every 4th layer (3, 7, ...: NoPE layers attend globally, the rest in
        # chunks, as vLLM's llama4.py); 109B total, 17B active from the model card.
        ModelSpec(
            name="llama-4-scout", num_layers=48, hidden_size=5120, num_heads=40, num_kv_heads=8,
            head_dim=128, intermediate_size=8192, vocab_size=202048, max_model_len=10485760,
            num_params=109e9, num_active_params=17e9,
            layer_types=repeat((CHUNKED,) * 3 + (FULL,), 48), attention_chunk_size=8192,
        ),
        # deepseek-ai/DeepSeek-V3.2 config.json: DeepSeek-V3's dimensions (above) plus the
        # sparse attention's index_topk 2048, index_head_dim 128 (index_n_heads 64); 671B
        # total, 37B active; FP8 weights. The indexer's fp8 keys are cached per layer too.
        ModelSpec(
            name="deepseek-v3.2", num_layers=61, hidden_size=7168, num_heads=128,
            num_kv_heads=128, head_dim=128, intermediate_size=18432, vocab_size=129280,
            max_model_len=163840, num_params=671e9, num_active_params=37e9,
            weight_dtype_bytes=1, kv_lora_rank=512, qk_rope_head_dim=64, index_topk=2048,
            index_head_dim=128,
        ),
        # moonshotai/Kimi-K2-Instruct config.json: DeepSeek-V3 architecture, num_hidden_layers
        # 61, hidden_size 7168, num_attention_heads 64, kv_lora_rank 512, qk_rope_head_dim 64,
        # qk_nope_head_dim 128, v_head_dim 128, intermediate_size 18432 (n_routed_experts 384,
        # num_experts_per_tok 8), vocab_size 163840, max_position_embeddings 131072; 1.04T
        # total, 32B active from the model card; FP8 weights.
        ModelSpec(
            name="kimi-k2", num_layers=61, hidden_size=7168, num_heads=64, num_kv_heads=64,
            head_dim=128, intermediate_size=18432, vocab_size=163840, max_model_len=131072,
            num_params=1.04e12, num_active_params=32e9, weight_dtype_bytes=1,
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
        # kvlab's bundled trained model (engine/models/stdlib_llama/stdlib-llama: bf16, tied
        # embeddings)
        ModelSpec(
            name="stdlib-llama", num_layers=4, hidden_size=128, num_heads=4, num_kv_heads=2,
            head_dim=32, intermediate_size=384, vocab_size=2048, max_model_len=512,
            num_params=1_049_728, num_active_params=1_049_728, dtype_bytes=2,
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
        # B200 (HGX B200, one of 8): 180 GB HBM3e, 8 TB/s, 2.25 dense bf16 PFLOPS (4.5 with
        # sparsity), NVLink 5 1.8 TB/s (900 GB/s each way), PCIe Gen5 (~64 GB/s each way), from
        # NVIDIA's HGX B200 data sheet; the 180 GB as nvidia-smi counts it [unconfirmed].
        HardwareSpec(
            name="b200", hbm_bytes=180 * 10**9, hbm_bandwidth=8e12, peak_flops=2250e12,
            host_link_bandwidth=64e9, host_link_latency_s=10e-6, num_devices=8,
            step_overhead_s=3e-3, interconnect_bandwidth=900e9, interconnect_latency_s=10e-6,
            host_memory_bytes=256 * GiB,
        ),
        # H20 (8-GPU HGX): 96 GB HBM3, 4.0 TB/s, ~148 dense bf16 TFLOPS, NVLink 900 GB/s (450
        # each way), PCIe Gen5 [secondary: NVIDIA publishes no H20 data sheet; press figures].
        HardwareSpec(
            name="h20", hbm_bytes=96 * GiB, hbm_bandwidth=4.0e12, peak_flops=148e12,
            host_link_bandwidth=64e9, host_link_latency_s=10e-6, num_devices=8,
            step_overhead_s=3e-3, interconnect_bandwidth=450e9, interconnect_latency_s=10e-6,
            host_memory_bytes=256 * GiB,
        ),
        # Ascend 910C: two dies in one package, each a device to CANN and vLLM-Ascend (npu-smi
        # lists 64 GB per die), so the figures are per die: ~1.6 TB/s and ~376 dense fp16
        # TFLOPS (half the package's ~3.2 TB/s and ~752) [secondary]; host link and overheads
        # as the 910B [estimate]; the two dies' link [estimate: as the A2's HCCS].
        HardwareSpec(
            name="ascend-910c", hbm_bytes=64 * GiB, hbm_bandwidth=1.6e12, peak_flops=376e12,
            host_link_bandwidth=32e9, host_link_latency_s=20e-6, num_devices=2,
            step_overhead_s=5e-3, interconnect_bandwidth=196e9, interconnect_latency_s=20e-6,
            remote_bandwidth=21.75e9,
        ),
        # Atlas 800T A3: eight 910C, sixteen devices (dies) as vLLM-Ascend runs them (its
        # DeepSeek guides use tensor parallel 16 on one A3 node); per-device figures as
        # ascend-910c; the node's HCCS/UB link per device [estimate: as the A2's 196 GB/s];
        # host DRAM per device [estimate].
        HardwareSpec(
            name="atlas-800t-a3", hbm_bytes=64 * GiB, hbm_bandwidth=1.6e12, peak_flops=376e12,
            host_link_bandwidth=32e9, host_link_latency_s=20e-6, num_devices=16,
            step_overhead_s=5e-3, interconnect_bandwidth=196e9, interconnect_latency_s=20e-6,
            host_memory_bytes=128 * GiB, remote_bandwidth=21.75e9,
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

# Short names `--hardware` also takes: the GPU's name without its memory size.
HARDWARE_ALIASES = {"a100": "a100-80g", "h100": "h100-80g", "h200": "h200-141g"}
# fmt: on
