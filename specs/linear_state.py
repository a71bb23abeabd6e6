"""Bytes of the fixed-size state a linear-attention layer keeps per request.

A linear-attention layer (Gated DeltaNet in Qwen3-Next, Mamba2 in Nemotron-H, Granite 4,
Falcon-H1) keeps no per-token cache: each request holds one causal-conv window and one recurrent
state per layer, whatever its length. The shapes are vLLM's
(`vllm/model_executor/layers/mamba/mamba_utils.py`, `MambaStateShapeCalculator`, vLLM 0.32):

Gated DeltaNet (`gated_delta_net_state_shape`), from config.json's `linear_num_key_heads` (Hk),
`linear_num_value_heads` (Hv), `linear_key_head_dim` (Dk), `linear_value_head_dim` (Dv),
`linear_conv_kernel_dim` (K):

    conv state      (2 * Hk * Dk + Hv * Dv) x (K - 1)   elements (q, k and v channels)
    recurrent state  Hv x Dv x Dk                         elements

Mamba2 (`mamba2_state_shape`), from `mamba_num_heads` (H), `mamba_head_dim` (P), `n_groups`
(G), `ssm_state_size` (N), `conv_kernel` (K), with intermediate size I = H * P:

    conv state      (I + 2 * G * N) x (K - 1)   elements
    ssm state        H x P x N                   elements

Both states take the model's dtype unless vLLM's `--mamba-ssm-cache-dtype` (the recurrent/ssm
state) or `--mamba-cache-dtype` says otherwise (`MambaStateDtypeCalculator`; "auto" is the model
dtype). The figures are for tensor parallel 1: vLLM splits the conv channels and heads evenly
over the devices (`ModelSpec.linear_state_bytes_per_device`). Speculative tokens widen the conv
window by one column each; kvlab does not model them.
"""

from __future__ import annotations


def gated_delta_net_state_bytes(
    *,
    num_key_heads: int,
    num_value_heads: int,
    key_head_dim: int,
    value_head_dim: int,
    conv_kernel_dim: int,
    dtype_bytes: int,
    ssm_dtype_bytes: int | None = None,
) -> int:
    """Bytes of one Gated DeltaNet layer's conv + recurrent state for one request (tp 1)."""
    conv_channels = 2 * num_key_heads * key_head_dim + num_value_heads * value_head_dim
    conv = conv_channels * (conv_kernel_dim - 1) * dtype_bytes
    recurrent = num_value_heads * value_head_dim * key_head_dim
    return conv + recurrent * (ssm_dtype_bytes or dtype_bytes)


def mamba2_state_bytes(
    *,
    num_heads: int,
    head_dim: int,
    n_groups: int,
    state_size: int,
    conv_kernel: int,
    dtype_bytes: int,
    ssm_dtype_bytes: int | None = None,
) -> int:
    """Bytes of one Mamba2 layer's conv + ssm state for one request (tp 1)."""
    intermediate = num_heads * head_dim
    conv = (intermediate + 2 * n_groups * state_size) * (conv_kernel - 1) * dtype_bytes
    ssm = num_heads * head_dim * state_size
    return conv + ssm * (ssm_dtype_bytes or dtype_bytes)
